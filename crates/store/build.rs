//! Embeds the schema migrations (`migrations/sqlite`, `migrations/postgres`) as a list of file
//! names and contents, for `db.rs` to hand to sqlx's migrator. `sqlx::migrate!` does the same
//! at compile time, but needs sqlx's proc-macro crate, which builds a second copy of sqlx's
//! drivers for the compiler: the largest single cost of a clean build.

use std::fmt::Write;
use std::path::Path;

fn main() {
    let out = std::env::var("OUT_DIR").expect("OUT_DIR");
    let mut code = String::new();
    for (name, dir) in [
        ("SQLITE", "migrations/sqlite"),
        ("POSTGRES", "migrations/postgres"),
    ] {
        println!("cargo:rerun-if-changed={dir}");
        let dir = Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir")).join(dir);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.expect("directory entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "sql"))
            .collect();
        files.sort();
        writeln!(code, "pub(crate) const {name}: &[(&str, &str)] = &[").unwrap();
        for f in files {
            let file = f
                .file_name()
                .unwrap()
                .to_str()
                .expect("UTF-8 migration name");
            writeln!(
                code,
                "    ({file:?}, include_str!({:?})),",
                f.display().to_string()
            )
            .unwrap();
        }
        writeln!(code, "];").unwrap();
    }
    std::fs::write(Path::new(&out).join("migrations.rs"), code).expect("writing migrations.rs");
}
