//! A fake over streamable HTTP (`--http`), driven by rmcp's HTTP client.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::json;
use toolgate_fakes::record::read_records;

/// Kills the server it started when the test ends, pass or fail.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn field_serves_tools_and_records_calls_over_streamable_http() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("calls.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate-fake-field"))
        .args(["--http", "127.0.0.1:0", "--record"])
        .arg(&record)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the fake");
    let stderr = child.stderr.take().expect("stderr is piped");
    let _server = Server(child);
    let mut line = String::new();
    BufReader::new(stderr).read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_string();

    let client =
        ().serve(StreamableHttpClientTransport::from_uri(url))
            .await
            .expect("MCP handshake over HTTP");
    let tools = client.list_all_tools().await.expect("tools/list");
    assert!(tools.iter().any(|t| t.name == "schedule_technician"));
    let mut p = CallToolRequestParams::new("lookup_customer");
    p.arguments = json!({"customer_id": "cust-001"}).as_object().cloned();
    let r = client.call_tool(p).await.expect("tools/call");
    assert_eq!(
        r.structured_content.as_ref().unwrap()["name"],
        "Harbour Bakery"
    );
    client.cancel().await.ok();

    let recs = read_records(&record).unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].tool, "lookup_customer");
    assert_eq!(recs[0].server, "field");
}
