//! The inode-cache corpus (`scenarios/icache/`): for every scenario, the library runner
//! (vfscale-icache itself), the reference model (fs/inode.c) and the `.expected` file
//! agree. Scenarios under `errors/` must fail, with the message in `.expected`.
//! `VFSCALE_BLESS=1` writes missing `.expected` files from the model (review them).

use std::path::{Path, PathBuf};

use vfscale_conformance::icache::{library, reference, render_results, Scenario};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/icache")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    for p in v {
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "jsonl") {
            out.push(p);
        }
    }
}

fn run(text: &str) -> (String, String) {
    let render = |r: Result<Vec<_>, _>| match r {
        Ok(r) => render_results(&r),
        Err(e) => format!("error: {e}\n"),
    };
    match Scenario::parse(text) {
        Err(e) => (format!("error: {e}\n"), format!("error: {e}\n")),
        Ok(s) => (render(library::replay(&s)), render(reference::replay(&s))),
    }
}

#[test]
fn corpus_library_equals_model_equals_expected() {
    let mut all = Vec::new();
    files(&corpus(), &mut all);
    assert!(all.len() >= 20, "corpus too small: {}", all.len());
    let bless = std::env::var_os("VFSCALE_BLESS").is_some();
    let mut errors = 0;
    for f in &all {
        let text = std::fs::read_to_string(f).unwrap();
        let (lib, model) = run(&text);
        assert_eq!(lib, model, "{}: library and model differ", f.display());
        let is_err = f.parent().unwrap().ends_with("errors");
        assert_eq!(
            lib.starts_with("error: "),
            is_err,
            "{}: {}",
            f.display(),
            if is_err { "must fail" } else { "must replay" }
        );
        errors += is_err as usize;
        let exp = f.with_extension("expected");
        if bless && !exp.exists() {
            std::fs::write(&exp, &model).unwrap();
        }
        let want = std::fs::read_to_string(&exp).unwrap_or_else(|_| panic!("{} missing", exp.display()));
        assert_eq!(lib, want, "{}: results differ from .expected", f.display());
    }
    assert!(errors >= 10, "too few error scenarios: {errors}");
    eprintln!(
        "icache corpus: {} scenarios ({errors} error cases) agree",
        all.len()
    );
}
