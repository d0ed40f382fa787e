//! What another local user does to a Ray session folder (0777, no sticky
//! bit), for the tests that run it under a uid of its own:
//!
//! - `swap A B`: exchanges `A` and `B` with `renameat2(RENAME_EXCHANGE)` as
//!   fast as it can, until killed; prints `swapping` once it has swapped.
//! - `listen SOCKET`: listens on the Unix socket `SOCKET`, answers every
//!   request with `attacker`, and prints `accepted` for each connection and
//!   `received N` for each read of N bytes.
//!
//! It prints `ready` once set up; stdout is flushed after every line.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::process::ExitCode;

use rustix::fs::{renameat_with, RenameFlags, CWD};

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn swap(a: &str, b: &str) -> ExitCode {
    say("ready");
    let mut told = false;
    loop {
        if let Err(e) = renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE) {
            eprintln!("attacker: cannot exchange {a} and {b}: {e}");
            return ExitCode::FAILURE;
        }
        if !told {
            say("swapping");
            told = true;
        }
    }
}

fn listen(socket: &str) -> ExitCode {
    let listener = match UnixListener::bind(socket) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("attacker: cannot listen on {socket}: {e}");
            return ExitCode::FAILURE;
        }
    };
    say("ready");
    for stream in listener.incoming().flatten() {
        say("accepted");
        std::thread::spawn(move || {
            let mut stream = stream;
            let mut buf = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                say(&format!("received {n}"));
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nattacker");
            }
        });
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["swap", a, b] => swap(a, b),
        ["listen", socket] => listen(socket),
        _ => {
            eprintln!("usage: ray-dashd-test-attacker swap A B | listen SOCKET");
            ExitCode::from(64)
        }
    }
}
