//! Prompts and resources of an upstream pass through only when toolgate.yaml lists them: a
//! second upstream (`docs`, an in-process rmcp server recording every request it gets) offers
//! two prompts and two resources and no tools capability; the registry lists one of each. A real rmcp client sees only
//! the listed ones; asking for the others is answered as unknown and never reaches the upstream.

use std::sync::{Arc, Mutex};

use crate::common::*;
use rmcp::model::{
    GetPromptRequestParams, GetPromptResponse, GetPromptResult, ListPromptsResult,
    ListResourcesResult, ListToolsRequestMethod, ListToolsResult, PaginatedRequestParams, Prompt,
    PromptMessage, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, Role, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use tokio_util::sync::CancellationToken;
use toolgate_gateway::{Gateway, ServeOptions};

/// An upstream with prompts and resources only; `seen` records every get and read it served.
#[derive(Clone, Default)]
struct Docs {
    seen: Arc<Mutex<Vec<String>>>,
}

impl ServerHandler for Docs {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            // No tools capability: toolgate must not ask for a tools/list it was not offered.
            ServerCapabilities::builder()
                .enable_prompts()
                .enable_resources()
                .build(),
        )
    }

    /// As a server without tools answers in other SDKs: the method does not exist here.
    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.seen.lock().unwrap().push("tools/list".into());
        Err(ErrorData::method_not_found::<ListToolsRequestMethod>())
    }

    async fn list_prompts(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(vec![
            Prompt::new("invoice_summary", Some("Summarise an invoice"), None),
            Prompt::new("wire_instructions", Some("Unlisted"), None),
        ]))
    }

    async fn get_prompt(
        &self,
        r: GetPromptRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        self.seen.lock().unwrap().push(format!("prompt:{}", r.name));
        Ok(GetPromptResult::new(vec![PromptMessage::new_text(
            Role::User,
            format!("the {} prompt", r.name),
        )])
        .into())
    }

    async fn list_resources(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::with_all_items(vec![
            Resource::new("docs://policy/payments", "payments policy"),
            Resource::new("docs://secrets/keys", "unlisted"),
        ]))
    }

    async fn read_resource(
        &self,
        r: ReadResourceRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        self.seen
            .lock()
            .unwrap()
            .push(format!("resource:{}", r.uri));
        Ok(ReadResourceResult::new(vec![ResourceContents::text("contents", r.uri)]).into())
    }
}

async fn start() -> (Harness, Docs) {
    let docs = Docs::default();
    let served = docs.clone();
    let service = StreamableHttpService::new(
        move || Ok(served.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let docs_addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, axum::Router::new().nest_service("/mcp", service))
            .await
            .unwrap()
    });

    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("erp-calls.jsonl");
    let (fake, fake_stop) = start_fake_finance(&record, Vec::new()).await;
    write_registry(
        dir.path(),
        &format!(
            "    url: \"http://{fake}/mcp\"\n    package: \"toolgate-fakes@0.1.0\"\n    timeout_secs: 2\n\
             \x20 docs:\n    url: \"http://{docs_addr}/mcp\"\n    package: \"docs@1.0.0\"\n\
             \x20   prompts: [invoice_summary]\n    resources: [\"docs://policy/payments\"]\n"
        ),
    );
    let gateway = Gateway::build(&ServeOptions {
        config_dir: dir.path().to_path_buf(),
        http: true,
        keys: toolgate_gateway::KeySource::Dev,
        ..ServeOptions::default()
    })
    .await
    .expect("gateway builds");
    let stop = CancellationToken::new();
    let (addr, fut) = gateway
        .bind_http("127.0.0.1:0", stop.clone())
        .await
        .unwrap();
    tokio::spawn(fut);
    (
        Harness::from_parts(dir, record, addr, gateway, stop, fake_stop),
        docs,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_listed_prompt_and_resource_pass_through() {
    let (h, docs) = start().await;
    let client = h.client(PLANNER_KEY).await;
    let info = client.peer().peer_info().unwrap();
    assert!(info.capabilities.prompts.is_some());
    assert!(info.capabilities.resources.is_some());

    let prompts = client.peer().list_all_prompts().await.unwrap();
    let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["invoice_summary"]);
    let resources = client.peer().list_all_resources().await.unwrap();
    let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
    assert_eq!(uris, ["docs://policy/payments"]);

    let got = client
        .peer()
        .get_prompt(GetPromptRequestParams::new("invoice_summary"))
        .await
        .unwrap();
    assert_eq!(got.messages.len(), 1);
    let read = client
        .peer()
        .read_resource(ReadResourceRequestParams::new("docs://policy/payments"))
        .await
        .unwrap();
    assert_eq!(read.contents.len(), 1);

    // The unlisted ones: answered exactly as names that do not exist, never fetched.
    let unlisted = client
        .peer()
        .get_prompt(GetPromptRequestParams::new("wire_instructions"))
        .await
        .unwrap_err();
    let missing = client
        .peer()
        .get_prompt(GetPromptRequestParams::new("no_such_prompt"))
        .await
        .unwrap_err();
    assert_eq!(
        unlisted.to_string().replace("wire_instructions", "X"),
        missing.to_string().replace("no_such_prompt", "X")
    );
    assert!(
        client
            .peer()
            .read_resource(ReadResourceRequestParams::new("docs://secrets/keys"))
            .await
            .is_err()
    );
    assert_eq!(
        *docs.seen.lock().unwrap(),
        ["prompt:invoice_summary", "resource:docs://policy/payments"]
    );
    h.shutdown().await;
}
