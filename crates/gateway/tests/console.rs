//! `toolgate serve` carries the approver's page and `/metrics` in the same process.

use crate::common::Harness;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_mounts_the_approval_page_and_metrics() {
    let h = Harness::start().await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let base = format!("http://{}", h.addr);

    // The queue needs a signed-in approver: a visitor is sent to the sign-in page.
    let r = client
        .get(format!("{base}/approvals"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let to = r.headers()["location"].to_str().unwrap().to_string();
    assert!(to.starts_with("/approvals/login"), "{to}");
    let page = client.get(format!("{base}{to}")).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("action=\"/approvals/login\"")
    );

    // The surface numbers in the Prometheus format.
    let m = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(m.status().as_u16(), 200);
    assert!(
        m.text()
            .await
            .unwrap()
            .contains("# TYPE toolgate_calls_total counter")
    );
    h.shutdown().await;
}
