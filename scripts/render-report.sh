#!/usr/bin/env bash
# Renders a vfscale report in headless Chromium: report.png (the page as a browser draws
# it) next to report.html, and prints what the page shows — the number of headline lines,
# summary tables and plots, and each plot's rendered size — as one JSON line.
#
#   scripts/render-report.sh [REPORT_DIR]      (default: vfscale-report)
#
# Needs Debian's chromium (apt-get install chromium). Exit 2 when it is missing.
set -euo pipefail
dir=${1:-vfscale-report}
[ -f "$dir/report.html" ] || { echo "render-report: no $dir/report.html" >&2; exit 1; }
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "render-report: SKIP: no chromium (apt-get install chromium)" >&2; exit 2; }
dir=$(cd "$dir" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
       --disable-background-networking --disable-component-update --disable-sync
       --hide-scrollbars --user-data-dir="$work/profile")
"$browser" "${flags[@]}" --window-size=1400,3000 --screenshot="$dir/report.png" \
  "file://$dir/report.html" >/dev/null 2>&1
cat > "$work/check.html" <<HTML
<!DOCTYPE html><html><body><pre id="result">pending</pre>
<iframe id="r" src="file://$dir/report.html" style="width:1400px;height:3000px"></iframe>
<script>
document.getElementById('r').onload = function () {
  var d = this.contentDocument, out = {};
  try {
    out.headline = d.querySelectorAll('#headline li').length;
    out.summary_tables = d.querySelectorAll('#summary table').length;
    out.summary_rows = d.querySelectorAll('#summary tbody tr').length;
    out.plots = Array.from(d.querySelectorAll('figure.plot svg')).map(function (s) {
      var b = s.getBoundingClientRect();
      return [Math.round(b.width), Math.round(b.height)];
    });
  } catch (e) { out.error = String(e); }
  document.getElementById('result').textContent = JSON.stringify(out);
};
</script></body></html>
HTML
"$browser" "${flags[@]}" --allow-file-access-from-files --virtual-time-budget=10000 \
  --dump-dom "file://$work/check.html" 2>/dev/null |
  sed -n 's/.*<pre id="result">\([^<]*\)<\/pre>.*/\1/p'
