//! The audit as SARIF 2.1.0, for code-scanning tools. A tool definition has no file and line, so
//! each result carries a logical location (`server/tool/path`) rather than a physical one.

use serde_json::{Value, json};

use crate::audit::{AuditReport, RULES, Severity, Status};

pub const SARIF_SCHEMA: &str = "https://json.schemastore.org/sarif-2.1.0.json";

fn level(severity: Severity) -> &'static str {
    match severity {
        Severity::High => "error",
        Severity::Medium => "warning",
        Severity::Low | Severity::Info => "note",
    }
}

/// Renders an audit report as a SARIF 2.1.0 log with one run.
pub fn to_sarif(report: &AuditReport, tool_version: &str) -> Value {
    let rules: Vec<Value> = RULES
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "name": r.id,
                "shortDescription": { "text": r.summary },
                "fullDescription": { "text": r.summary },
                "help": { "text": r.help },
            })
        })
        .collect();
    let server = if report.server.name.is_empty() {
        "server"
    } else {
        report.server.name.as_str()
    };
    let results: Vec<Value> = report
        .findings
        .iter()
        .map(|f| {
            let index = RULES.iter().position(|r| r.id == f.rule).unwrap_or(0);
            let mut name = server.to_string();
            if let Some(t) = &f.tool {
                name = format!("{name}/{t}");
            }
            if let Some(p) = &f.path {
                name = format!("{name}/{p}");
            }
            let mut result = json!({
                "ruleId": f.rule,
                "ruleIndex": index,
                "message": { "text": f.message },
                "locations": [{
                    "logicalLocations": [{
                        "name": f.tool.clone().unwrap_or_else(|| server.to_string()),
                        "fullyQualifiedName": name,
                        "kind": if f.tool.is_some() { "function" } else { "module" },
                    }]
                }],
                "properties": { "severity": f.severity.as_str() },
            });
            match f.status {
                Status::Fail => {
                    result["kind"] = json!("fail");
                    result["level"] = json!(level(f.severity));
                }
                Status::Undetermined => {
                    result["kind"] = json!("review");
                    result["level"] = json!("none");
                }
            }
            result
        })
        .collect();
    json!({
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {
                "driver": {
                    "name": "toolgate",
                    "version": tool_version,
                    "rules": rules,
                }
            },
            "invocations": [{ "executionSuccessful": true }],
            "properties": {
                "target": report.target,
                "server": { "name": report.server.name, "version": report.server.version },
            },
            "results": results,
        }]
    })
}
