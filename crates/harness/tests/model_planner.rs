//! The model-backed planner against a local fake HTTP endpoint that returns a canned
//! completion, for both APIs (OpenAI-compatible chat completions, Anthropic messages): what it
//! sends, what it makes of the answer, and that its plan goes through `plan.submit` like any
//! other. No real model and no network beyond loopback.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};
use toolgate_harness::demo::{examples_dir, run_status, submit};
use toolgate_harness::planner::{ModelApi, ModelConfig, ModelPlanner, Planner, PlannerConfig};
use toolgate_harness::{Environment, ToolSummary};

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(HeaderMap, Value)>>>);

/// The plan a model "proposes": two steps of the field-services dispatch run, in a fenced block.
fn canned_plan() -> String {
    let plan = json!({
        "goal": "Book the oven repair",
        "steps": [
            {"tool": "lookup_customer", "inputs": {"customer_id": "cust-001"}, "purpose": "service_delivery",
             "reason": "Find the customer.", "evidence": ["cust-001"]},
            {"tool": "schedule_technician", "inputs": {"work_order_id": "wo-001", "technician_id": "tech-001", "date": "2026-06-12", "window": "am"},
             "purpose": "service_delivery", "reason": "Book the technician.", "evidence": ["wo-001"]}
        ]
    });
    format!("Here is the plan:\n```json\n{plan}\n```")
}

async fn openai(
    State(seen): State<Seen>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Json<Value> {
    seen.0.lock().unwrap().push((headers, body));
    Json(json!({"id": "cmpl-1", "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": canned_plan()}, "finish_reason": "stop"}]}))
}

async fn anthropic(
    State(seen): State<Seen>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Json<Value> {
    seen.0.lock().unwrap().push((headers, body));
    Json(
        json!({"id": "msg_1", "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": canned_plan()}], "stop_reason": "end_turn"}),
    )
}

async fn fake_endpoint() -> (String, Seen) {
    let seen = Seen::default();
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(openai))
        .route("/v1/messages", post(anthropic))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), seen)
}

fn catalogue() -> Vec<ToolSummary> {
    vec![ToolSummary {
        name: "lookup_customer".into(),
        description: "Look up a customer.".into(),
        input_schema: json!({"type": "object"}),
        worker: None,
    }]
}

fn config(base_url: &str) -> ModelConfig {
    ModelConfig {
        base_url: base_url.into(),
        model: "planner-test-1".into(),
        api_key_env: Some("TOOLGATE_TEST_PLANNER_KEY".into()),
        max_tokens: 512,
        timeout_secs: 5,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_apis_send_the_goal_and_tools_and_parse_the_plan_from_the_completion() {
    // SAFETY: set once, before any planner reads it; no other test in this binary reads it.
    unsafe { std::env::set_var("TOOLGATE_TEST_PLANNER_KEY", "sk-test-123") };
    let (base, seen) = fake_endpoint().await;
    let observation = json!({"customer": {"id": "cust-001"}});
    for api in [ModelApi::OpenAi, ModelApi::Anthropic] {
        let planner = ModelPlanner::new(api, config(&base), catalogue()).unwrap();
        let plan = planner
            .plan("Book the oven repair", std::slice::from_ref(&observation))
            .await
            .expect("a plan from the canned completion");
        assert_eq!(plan.steps.len(), 2);
        assert_eq!(plan.steps[1].tool, "schedule_technician");
        assert_eq!(plan.steps[1].inputs["technician_id"], "tech-001");
        assert_eq!(plan.steps[0].evidence, ["cust-001"]);
        let (headers, body) = seen
            .0
            .lock()
            .unwrap()
            .pop()
            .expect("the endpoint was called");
        assert_eq!(body["model"], "planner-test-1");
        let user = match api {
            ModelApi::OpenAi => {
                assert_eq!(headers["authorization"], "Bearer sk-test-123");
                assert_eq!(body["messages"][0]["role"], "system");
                body["messages"][1]["content"].as_str().unwrap().to_string()
            }
            ModelApi::Anthropic => {
                assert_eq!(headers["x-api-key"], "sk-test-123");
                assert_eq!(headers["anthropic-version"], "2023-06-01");
                assert!(body["system"].as_str().unwrap().contains("JSON object"));
                body["messages"][0]["content"].as_str().unwrap().to_string()
            }
        };
        assert!(user.contains("Goal: Book the oven repair"), "{user}");
        assert!(
            user.contains("lookup_customer"),
            "the tool catalogue is sent"
        );
        assert!(user.contains("cust-001"), "the observations are sent");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_chooses_the_planner_and_a_model_plan_goes_through_plan_submit() {
    let (base, _seen) = fake_endpoint().await;
    let cfg: PlannerConfig = yaml_serde::from_str(&format!(
        "kind: openai\nbase_url: \"{base}\"\nmodel: planner-test-1\n"
    ))
    .unwrap();
    assert!(matches!(cfg, PlannerConfig::Openai(_)));
    let planner = cfg.build(catalogue()).unwrap();
    let plan = planner.plan("Book the oven repair", &[]).await.unwrap();

    let env = Environment::start(&examples_dir().join("field-services"), None, Vec::new())
        .await
        .unwrap();
    let agent = env
        .client(toolgate_harness::demo::DISPATCH_KEY)
        .await
        .unwrap();
    let run = submit(&agent, &plan, "service_delivery").await.unwrap();
    let st = run_status(&agent, &run).await.unwrap();
    let tools: Vec<&str> = st["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["tool"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["lookup_customer", "schedule_technician"]);
    assert!(
        st["steps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["status"] == "pending")
    );
    assert!(
        env.all_upstream_calls().is_empty(),
        "a plan executes nothing"
    );
    agent.close().await;
    env.shutdown().await;

    let https = PlannerConfig::Anthropic(config("https://api.anthropic.com/v1"));
    assert!(
        https.build(Vec::new()).is_err(),
        "no TLS in this build: said, not attempted"
    );
}
