//! The same script on the running kernel (in a forked child, through libc) and on the
//! table: identical results (fd, or -errno).

use std::sync::Arc;

use vfscale_fdtable::{CloseRangeFlags, Errno, Fd, FdTable, Settings};

const N: usize = 22;

fn nr_open() -> u32 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20)
}

/// The script on the kernel. Runs in the forked child: libc calls only, no allocation.
fn kernel_script(nr_open: u32, out: &mut [i64; N]) {
    // SAFETY: plain system calls on descriptors this (child) process owns; no memory is
    // passed except the rlimit struct on the stack.
    unsafe {
        let r = |v: libc::c_int| -> i64 {
            if v < 0 {
                -(*libc::__errno_location()) as i64
            } else {
                v as i64
            }
        };
        let rl = |n: u64| {
            let l = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &l)
        };
        let close_range =
            |a: u32, b: u32, f: u32| libc::syscall(libc::SYS_close_range, a, b, f) as libc::c_int;
        close_range(3, !0u32, 0);
        rl(64);
        out[0] = r(libc::dup2(0, 64));
        out[1] = r(libc::fcntl(0, libc::F_DUPFD, 64));
        out[2] = r(libc::fcntl(99, libc::F_DUPFD, 1000));
        out[3] = r(libc::dup3(0, 0, 0));
        out[4] = r(libc::dup2(0, 0));
        out[5] = r(libc::dup2(50, 50));
        out[6] = r(libc::dup(0));
        out[7] = r(libc::fcntl(0, libc::F_DUPFD_CLOEXEC, 10));
        out[8] = r(libc::fcntl(10, libc::F_GETFD));
        out[9] = r(close_range(5, 4, 0));
        out[10] = r(close_range(3, !0u32, libc::CLOSE_RANGE_CLOEXEC));
        out[11] = r(libc::fcntl(3, libc::F_GETFD));
        out[12] = r(libc::dup2(0, 63));
        rl(20);
        out[13] = r(libc::fcntl(63, libc::F_GETFD));
        out[14] = r(libc::dup(0));
        let mut n = 0;
        let mut last = 0;
        for _ in 0..100 {
            last = r(libc::dup(0));
            if last < 0 {
                break;
            }
            n += 1;
        }
        out[15] = n;
        out[16] = last;
        out[17] = r(rl(nr_open as u64 + 1));
        out[18] = r(libc::close(63));
        out[19] = r(libc::close(63));
        out[20] = r(close_range(4, !0u32, 0));
        out[21] = r(libc::fcntl(10, libc::F_GETFD));
    }
}

fn table_script(nr_open: u32) -> [i64; N] {
    let t: FdTable<u32> = FdTable::with_limits(Settings::default(), 1024, nr_open);
    for i in 0..3 {
        t.open(Arc::new(i), false).unwrap();
    }
    let e = |x: Errno| -(x.raw() as i64);
    let f = |x: Result<Fd, Errno>| x.map_or_else(e, |f| f.0 as i64);
    let u = |x: Result<(), Errno>| x.map_or_else(e, |_| 0);
    let c = |x: Result<bool, Errno>| x.map_or_else(e, |b| b as i64);
    let mut out = [0i64; N];
    t.set_rlimit_nofile(64).unwrap();
    out[0] = f(t.dup2(Fd(0), Fd(64)));
    out[1] = f(t.dupfd(Fd(0), 64, false));
    out[2] = f(t.dupfd(Fd(99), 1000, false));
    out[3] = f(t.dup3(Fd(0), Fd(0), false));
    out[4] = f(t.dup2(Fd(0), Fd(0)));
    out[5] = f(t.dup2(Fd(50), Fd(50)));
    out[6] = f(t.dup(Fd(0)));
    out[7] = f(t.dupfd(Fd(0), 10, true));
    out[8] = c(t.get_cloexec(Fd(10)));
    out[9] = u(t.close_range(5, 4, CloseRangeFlags::default()).map(|_| ()));
    out[10] = u(t
        .close_range(
            3,
            u32::MAX,
            CloseRangeFlags {
                cloexec: true,
                unshare: false,
            },
        )
        .map(|_| ()));
    out[11] = c(t.get_cloexec(Fd(3)));
    out[12] = f(t.dup2(Fd(0), Fd(63)));
    t.set_rlimit_nofile(20).unwrap();
    out[13] = c(t.get_cloexec(Fd(63)));
    out[14] = f(t.dup(Fd(0)));
    let mut n = 0;
    let mut last = 0;
    for _ in 0..100 {
        last = f(t.dup(Fd(0)));
        if last < 0 {
            break;
        }
        n += 1;
    }
    out[15] = n;
    out[16] = last;
    out[17] = u(t.set_rlimit_nofile(nr_open + 1));
    out[18] = u(t.close(Fd(63)));
    out[19] = u(t.close(Fd(63)));
    out[20] = u(t.close_range(4, u32::MAX, CloseRangeFlags::default()).map(|_| ()));
    out[21] = c(t.get_cloexec(Fd(10)));
    out
}

#[test]
fn kernel_and_table_agree() {
    let nr = nr_open();
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe() writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only makes system calls (kernel_script) and then _exit()s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let mut out = [0i64; N];
        // SAFETY: child side: the script closes everything from 3 up, so the pipe's write
        // end is moved onto fd 1, which stays open throughout the script.
        unsafe {
            libc::dup2(fds[1], 1);
        }
        kernel_script(nr, &mut out);
        // SAFETY: writes the result array to the pipe (now fd 1) and exits.
        unsafe {
            libc::write(
                1,
                out.as_ptr() as *const libc::c_void,
                std::mem::size_of_val(&out),
            );
            libc::_exit(0);
        }
    }
    // SAFETY: parent: close our write end, read the child's results, reap it.
    let kernel = unsafe {
        libc::close(fds[1]);
        let mut out = [0i64; N];
        let want = std::mem::size_of_val(&out);
        let mut got = 0;
        while got < want {
            let n = libc::read(
                fds[0],
                (out.as_mut_ptr() as *mut u8).add(got) as *mut libc::c_void,
                want - got,
            );
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        libc::close(fds[0]);
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
        assert_eq!(got, want, "child did not report");
        out
    };
    let table = table_script(nr);
    for i in 0..N {
        assert_eq!(
            table[i], kernel[i],
            "step {i}: table {} vs kernel {}",
            table[i], kernel[i]
        );
    }
}
