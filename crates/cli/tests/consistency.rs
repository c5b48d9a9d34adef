//! The commands in one shape, as the real binary runs them: every command that reads a store
//! leaves a missing one missing and fails (never "0 records verified", exit 0); `check` takes
//! `-c` like every other command; `demo` runs from any folder with nothing but the binary, and
//! each command its "Next" lines print works against the demo's own store; no ANSI colour
//! reaches a file.

use std::path::{Path, PathBuf};
use std::process::Command;

fn toolgate() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    c.env_remove("TOOLGATE_CONFIG")
        .env_remove("TOOLGATE_STORE_URL");
    c
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn acme(tmp: &Path) -> PathBuf {
    let dir = tmp.join("acme");
    copy_dir(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../core/tests/fixtures/acme"),
        &dir,
    );
    dir
}

#[test]
fn read_only_commands_never_create_a_store() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = acme(tmp.path());
    let db = dir.join("acme.db");
    let elsewhere = tmp.path().join("other.db");
    let store_flag = format!("sqlite://{}", elsewhere.display());
    for args in [
        vec!["trace", "run-1"],
        vec!["log", "verify"],
        vec!["log", "export", "--principal", "ap-agent"],
        vec!["report"],
        vec!["approvals", "list"],
        vec!["approvals", "show", "00000000-0000-0000-0000-000000000000"],
    ] {
        for store in [None, Some(store_flag.as_str())] {
            let mut cmd = toolgate();
            cmd.args(&args).arg("-c").arg(&dir);
            if let Some(s) = store {
                cmd.args(["--store", s]);
            }
            let out = cmd.output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{args:?} {store:?} succeeded");
            assert!(err.contains("no store at"), "{args:?} {store:?}: {err}");
            assert!(
                !db.exists() && !elsewhere.exists(),
                "{args:?} created a store"
            );
        }
    }
}

#[test]
fn check_takes_c_like_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = acme(tmp.path());
    for args in [
        vec!["check", "-c"],
        vec!["check", "--config"],
        vec!["check"],
    ] {
        let out = toolgate().args(&args).arg(&dir).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("ok: "), "{args:?}: {text}");
    }
}

#[test]
fn the_demo_runs_from_any_folder_and_its_next_lines_work_on_its_store() {
    let somewhere = tempfile::tempdir().unwrap();
    let out = toolgate()
        .arg("demo")
        .current_dir(somewhere.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains('\u{1b}'), "ANSI colour written to a pipe");
    let next = &text[text.find("== Next").expect("a Next section")..];
    let commands: Vec<Vec<String>> = next
        .lines()
        .filter_map(|l| l.find("toolgate ").map(|i| &l[i..]))
        .map(|c| c.split_whitespace().skip(1).map(str::to_string).collect())
        .collect();
    assert!(commands.len() >= 4, "{next}");
    let mut saw_approval = false;
    for args in commands {
        let out = toolgate().args(&args).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "`toolgate {}` from the demo's Next lines failed:\n{stdout}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        if args[0] == "approvals" {
            assert!(stdout.contains("payment.schedule"), "{stdout}");
            saw_approval = true;
        }
        if args[0] == "trace" {
            assert!(stdout.contains("step"), "{stdout}");
        }
    }
    assert!(saw_approval, "the Next lines name the parked payment");
}
