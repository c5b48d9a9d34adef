use super::*;
use crate::config::PreviousKey;

fn rules(g: &GatewayFile) -> Vec<(String, String)> {
    check(g)
        .into_iter()
        .map(|f| (f.path, f.rule))
        .collect::<Vec<_>>()
}

#[test]
fn the_defaults_pass() {
    assert!(check(&GatewayFile::default()).is_empty());
}

#[test]
fn a_key_id_must_fit_in_a_token_and_each_previous_key_needs_its_own_id_and_one_source() {
    let mut g = GatewayFile::default();
    g.approvals.key_id = "k.2".into();
    g.approvals.previous = vec![
        PreviousKey {
            id: "k1".into(),
            env: Some("OLD".into()),
            file: None,
        },
        PreviousKey {
            id: "k1".into(),
            env: None,
            file: None,
        },
        PreviousKey {
            id: "k0".into(),
            env: Some("A".into()),
            file: Some("a.key".into()),
        },
    ];
    assert_eq!(
        rules(&g),
        [
            ("approvals.key_id".to_string(), "config.key-id".to_string()),
            ("approvals.previous[1].id".into(), "config.key-id".into()),
            ("approvals.previous[1]".into(), "config.key-source".into()),
            ("approvals.previous[2]".into(), "config.key-source".into()),
        ]
    );
    let mut g = GatewayFile::default();
    g.approvals.previous = vec![PreviousKey {
        id: "k1".into(),
        env: Some("OLD".into()),
        file: None,
    }];
    let f = check(&g);
    assert_eq!(f.len(), 1);
    assert!(
        f[0].message.contains("also the current key's id"),
        "{}",
        f[0]
    );
}
