//! The lockfile parser (`toolgate.lock`) on untrusted text: a hand-edited or corrupted lockfile
//! must be refused with a message, never crash the gateway at start. What parses must render and
//! parse back to the same pins (the gateway rewrites the file on `lock approve`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolgate_contract::Lockfile;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(lock) = Lockfile::parse("toolgate.lock", text) else {
        return;
    };
    let rendered = lock.render();
    let again = Lockfile::parse("toolgate.lock", &rendered).unwrap_or_else(|e| {
        panic!("a parsed lockfile renders to text it refuses: {e}\n{rendered}")
    });
    assert_eq!(
        again.render(),
        rendered,
        "rendering is not stable across a parse"
    );
});
