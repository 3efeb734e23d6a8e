//! Test helper for the loader tests (never shipped): prints the process's environment, sorted,
//! as seen from the main thread, then whether worker threads see the same; optionally execs a
//! program afterwards.
//!
//! `hami-preload-probe [--set K=V] [--unset K] [--threads N] [--exit CODE] [--exec PROGRAM ARGS...]`

use std::io::Write;
use std::os::unix::process::CommandExt;

fn sorted_env() -> Vec<String> {
    let mut env: Vec<String> = std::env::vars_os()
        .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
        .collect();
    env.sort();
    env
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut threads = 0usize;
    let mut exit = 0i32;
    let mut exec: Vec<String> = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--threads" => threads = args.next().and_then(|n| n.parse().ok()).unwrap_or(4),
            "--exit" => exit = args.next().and_then(|n| n.parse().ok()).unwrap_or(0),
            "--exec" => exec = args.by_ref().collect(),
            // setenv/unsetenv over the environment the library built (glibc copies or compacts
            // an array it did not allocate).
            "--set" => {
                if let Some((k, v)) = args.next().as_deref().and_then(|kv| kv.split_once('=')) {
                    // SAFETY: single-threaded here: no thread has been started yet.
                    #[allow(unsafe_code)]
                    unsafe {
                        std::env::set_var(k, v)
                    };
                }
            }
            "--unset" => {
                if let Some(k) = args.next() {
                    // SAFETY: as above.
                    #[allow(unsafe_code)]
                    unsafe {
                        std::env::remove_var(k)
                    };
                }
            }
            other => {
                eprintln!("hami-preload-probe: unknown argument {other:?}");
                std::process::exit(64);
            }
        }
    }
    let main_env = sorted_env();
    let mut out = std::io::stdout().lock();
    for line in &main_env {
        let _ = writeln!(out, "{line}");
    }
    if threads > 0 {
        let handles: Vec<_> = (0..threads)
            .map(|_| std::thread::spawn(sorted_env))
            .collect();
        let agree = handles
            .into_iter()
            .all(|h| h.join().is_ok_and(|env| env == main_env));
        let _ = writeln!(out, "--threads {threads} agree={agree}");
    }
    let _ = out.flush();
    drop(out);
    if let Some((program, rest)) = exec.split_first() {
        let error = std::process::Command::new(program).args(rest).exec();
        eprintln!("hami-preload-probe: exec {program}: {error}");
        std::process::exit(127);
    }
    std::process::exit(exit);
}
