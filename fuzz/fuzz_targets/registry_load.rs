//! The registry loader on untrusted files: a registry folder arrives as one input, its files
//! separated by header lines `#== <path>` (`toolgate.yaml` first, without a header, then
//! `principals.yaml`, `tools/*.yaml` and `policies/*.cedar`). Each file goes through the same
//! parser `Registry::load` uses (`parse_yaml`), then `Registry::from_sources` checks the whole
//! folder and the lint reads the result. Any outcome is fine except a panic.
#![no_main]

use std::collections::BTreeMap;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use toolgate_core::config::{GatewayFile, PrincipalsFile, ToolsFile};
use toolgate_core::registry::{Sources, parse_yaml};
use toolgate_core::{LoadError, Registry};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = load(text);
});

fn load(text: &str) -> Result<(), LoadError> {
    let mut files: Vec<(String, String)> = vec![("toolgate.yaml".into(), String::new())];
    for line in text.split_inclusive('\n') {
        match line.strip_prefix("#== ") {
            Some(name) => files.push((name.trim().to_string(), String::new())),
            None => files.last_mut().expect("never empty").1.push_str(line),
        }
    }
    let mut gateway = GatewayFile::default();
    let mut principals = PrincipalsFile {
        roles: BTreeMap::new(),
        principals: vec![],
    };
    let mut tools = Vec::new();
    let mut policies = Vec::new();
    for (name, body) in files {
        if name == "toolgate.yaml" {
            gateway = parse_yaml(&name, &body)?;
        } else if name == "principals.yaml" {
            principals = parse_yaml(&name, &body)?;
        } else if name.ends_with(".cedar") {
            policies.push((name, body));
        } else {
            let file: ToolsFile = parse_yaml(&name, &body)?;
            for (i, t) in file.tools.into_iter().enumerate() {
                tools.push((name.clone(), i, t));
            }
        }
    }
    let sources = Sources {
        gateway,
        tools,
        principals,
        policies,
    };
    let registry = Registry::from_sources(Path::new("fuzz"), sources)?;
    let _ = toolgate_core::lint::lint(&registry);
    Ok(())
}
