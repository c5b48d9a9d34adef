use super::*;
use crate::registry::{LoadError, Registry};
use serde_json::json;

fn finding<T: PartialOrd + Display + Copy>(b: &Bound<T>, value: T) -> Option<Finding> {
    b.check("toolgate.yaml", "a.setting".into(), value)
}

#[test]
fn each_bound_passes_its_ends_and_its_default_and_refuses_beyond_them() {
    fn ends<T: PartialOrd + Display + Copy + std::fmt::Debug>(
        b: &Bound<T>,
        below: Option<T>,
        above: Option<T>,
    ) {
        assert_eq!(finding(b, b.min), None, "{b:?}");
        assert_eq!(finding(b, b.max), None, "{b:?}");
        if let Some(d) = b.default {
            assert_eq!(finding(b, d), None, "the default of {b:?} passes");
        }
        for v in below.into_iter().chain(above) {
            let f = finding(b, v).unwrap_or_else(|| panic!("{v} must be refused by {b:?}"));
            assert_eq!(f.rule, "config.range");
            assert!(f.fix.starts_with("set it "), "{}", f.fix);
        }
    }
    ends(&APPROVAL_EXPIRY_HOURS, Some(0), Some(721));
    ends(&IDEMPOTENCY_RETENTION_HOURS, Some(0), Some(8_761));
    ends(&WAL_PREALLOCATE_MB, None, Some(1_025));
    ends(&UPSTREAM_TIMEOUT_SECS, Some(0.0), Some(3_600.5));
    ends(&RATE_LIMIT_PER_RUN, Some(0), None);
    ends(&PREVIEW_EXPIRY_SECS, Some(0), Some(604_801));
    ends(&DAILY_BUDGET, Some(0), None);
}

#[test]
fn a_refusal_says_what_the_value_would_do_and_what_passes() {
    let f = finding(&APPROVAL_EXPIRY_HOURS, -1).unwrap();
    assert_eq!(
        f.message,
        "setting is -1: every approval request would be born expired, so no gated call could be \
         approved"
    );
    assert_eq!(f.fix, "set it from 1 to 720 (hours); the default is 72");
    let f = finding(&DAILY_BUDGET, 0).unwrap();
    assert_eq!(f.fix, "set it to at least 1 (calls a day)");
    // NaN and infinities are not timeouts (a NaN would panic as a Duration). YAML's `.nan`
    // cannot reach the config (JSON has no NaN, so it arrives as a shape error), but a
    // registry built in code can carry one.
    for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -5.0] {
        assert!(finding(&UPSTREAM_TIMEOUT_SECS, v).is_some(), "{v}");
    }
    assert!(
        finding(&UPSTREAM_TIMEOUT_SECS, f64::NAN)
            .unwrap()
            .message
            .ends_with("it is not a number")
    );
}

/// The acme fixture with one file edited, loaded: the findings (or none).
fn load_edited(file: &str, edit: impl Fn(String) -> String) -> Vec<Finding> {
    let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/acme");
    let tmp = tempfile::tempdir().unwrap();
    for sub in ["", "tools", "policies"] {
        std::fs::create_dir_all(tmp.path().join(sub)).unwrap();
        for e in std::fs::read_dir(from.join(sub)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), tmp.path().join(sub).join(e.file_name())).unwrap();
            }
        }
    }
    let p = tmp.path().join(file);
    std::fs::write(&p, edit(std::fs::read_to_string(&p).unwrap())).unwrap();
    match Registry::load(tmp.path()) {
        Ok(_) => Vec::new(),
        Err(LoadError::Invalid(f)) => f,
        Err(e) => panic!("{e}"),
    }
}

fn at<'f>(findings: &'f [Finding], file: &str, path: &str) -> &'f Finding {
    findings
        .iter()
        .find(|f| f.file == file && f.path == path)
        .unwrap_or_else(|| panic!("no finding at {file} {path}: {findings:#?}"))
}

#[test]
fn out_of_range_settings_in_toolgate_yaml_fail_the_load_naming_their_path() {
    let f = load_edited("toolgate.yaml", |t| {
        t.replace(
            "package: \"toolgate-fakes@0.1.0\"",
            "package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 0",
        )
        .replace(
            "url: \"sqlite://acme.db\"",
            "url: \"sqlite://acme.db\"\n  wal_preallocate_mb: 999999",
        ) + "approvals: {expiry_hours: 0}\nidempotency: {retention_hours: -1}\n"
    });
    assert_eq!(
        at(&f, "toolgate.yaml", "approvals.expiry_hours").message,
        "expiry_hours is 0: every approval request would be born expired, so no gated call could \
         be approved"
    );
    at(&f, "toolgate.yaml", "idempotency.retention_hours");
    at(&f, "toolgate.yaml", "store.wal_preallocate_mb");
    assert_eq!(
        at(&f, "toolgate.yaml", "upstreams.erp.timeout_secs").message,
        "timeout_secs is 0: every call to it would time out before it could answer"
    );
    assert!(f.iter().all(|f| f.rule == "config.range"), "{f:#?}");
}

#[test]
fn out_of_range_rate_limits_previews_and_daily_budgets_fail_the_load() {
    let f = load_edited("tools/notes.yaml", |t| {
        t.replacen(
            "rate_limit: 2",
            "rate_limit: 0\n    preview: {expires_secs: 0}",
            1,
        )
    });
    let r = at(&f, "tools/notes.yaml", "tools[0].rate_limit");
    assert_eq!(r.fix, "set it to at least 1 (calls per run)");
    at(&f, "tools/notes.yaml", "tools[0].preview.expires_secs");

    let f = load_edited("principals.yaml", |t| {
        t.replacen(
            "budgets: {act: 8, spend: 3}",
            "budgets: {act: 8, spend: 0}",
            1,
        )
    });
    let b = at(&f, "principals.yaml", "principals[0].budgets.spend");
    assert!(
        b.message.contains("lower the grants' `max_tier`"),
        "{}",
        b.message
    );
    // A negative budget does not even parse: the shape error names it.
    let f = load_edited("principals.yaml", |t| {
        t.replacen(
            "budgets: {act: 8, spend: 3}",
            "budgets: {act: -1, spend: 3}",
            1,
        )
    });
    assert!(
        f.iter()
            .any(|f| f.rule == "config.shape" && f.path.contains("budgets.act")),
        "{f:#?}"
    );
}

#[test]
fn window_budgets_out_of_range_fail_the_load_where_they_are_compiled() {
    let schema = json!({"type": "object", "required": ["amount"],
                        "properties": {"amount": {"type": "number", "minimum": 0}}});
    let budgets: Vec<crate::config::WindowBudgetConfig> = serde_json::from_value(json!([
        {"id": "a", "limit": 0, "window": "1h"},
        {"id": "b", "limit": -3, "window": "1h"},
        {"id": "c", "limit": 3, "window": "0s"},
        {"id": "d", "limit": 3, "window": "-1h"},
        {"id": "e", "limit": 3, "window": "32d"},
        {"id": "f", "sum": "amount", "limit": 10, "window": "1h", "limits": {"p": 0}},
        {"id": "ok", "sum": "amount", "limit": 10.5, "window": "31d"}
    ]))
    .unwrap();
    let mut findings = Vec::new();
    let compiled = crate::budget::compile(
        "tools/t.yaml",
        0,
        &budgets,
        &schema,
        &["p"].into_iter().collect(),
        &mut findings,
    );
    let paths: Vec<&str> = findings.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "tools[0].window_budgets[0].limit",
            "tools[0].window_budgets[1].limit",
            "tools[0].window_budgets[2].window",
            "tools[0].window_budgets[3].window",
            "tools[0].window_budgets[4].window",
            "tools[0].window_budgets[5].limits.p",
        ]
    );
    assert_eq!(compiled.len(), 1, "only the budget in range is kept");
}

#[test]
fn the_shipped_registries_are_in_range() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for dir in [
        "examples/finance",
        "examples/field-services",
        "crates/core/tests/fixtures/acme",
    ] {
        let r = crate::registry::Sources::read(&root.join(dir)).unwrap();
        assert_eq!(check(&r.gateway, &r.tools, &r.principals), vec![], "{dir}");
    }
}
