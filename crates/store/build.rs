//! Embeds the schema migrations (`migrations/sqlite`, `migrations/postgres`) as a list of
//! (version, description, SQL), named as sqlx names them (`0004_pins.sql` is version 4,
//! "pins"), for `db.rs` to hand to sqlx's migrator; a file not named so fails the build. `sqlx::migrate!` does the same
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
        writeln!(code, "pub(crate) const {name}: &[(i64, &str, &str)] = &[").unwrap();
        for f in files {
            let file = f
                .file_name()
                .unwrap()
                .to_str()
                .expect("UTF-8 migration name");
            let (version, rest) = file
                .split_once('_')
                .unwrap_or_else(|| panic!("migration {file} is not named VERSION_DESCRIPTION.sql"));
            let version: i64 = version
                .parse()
                .unwrap_or_else(|_| panic!("migration {file} has no number before its '_'"));
            let description = rest.trim_end_matches(".sql").replace('_', " ");
            writeln!(
                code,
                "    ({version}, {description:?}, include_str!({:?})),",
                f.display().to_string()
            )
            .unwrap();
        }
        writeln!(code, "];").unwrap();
    }
    std::fs::write(Path::new(&out).join("migrations.rs"), code).expect("writing migrations.rs");
}
