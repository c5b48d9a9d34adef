//! The fixture tools the official MCP conformance suite's server scenarios call
//! (`@modelcontextprotocol/conformance`): put this server behind toolgate and compare the suite's
//! results with those of this server alone. Logging and sampling are deprecated by the
//! 2026-07-28 revision but still tested by the suite, hence the `deprecated` allowance.
#![allow(deprecated)]

use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{
    CallToolResult, ContentBlock, CreateMessageRequestParams, CustomRequest, LoggingLevel,
    LoggingMessageNotificationParam, ProgressNotificationParam, ResourceContents, SamplingMessage,
    ServerCapabilities, ServerRequest, Tool,
};
use rmcp::service::RequestContext;
use serde_json::{Value, json};

use crate::server::{Call, Domain, Reply};
use crate::{str_arg, tool, tool_error};

/// A 1×1 red PNG.
pub const RED_PIXEL_PNG: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";
/// Eight samples of 8-bit mono silence at 8 kHz.
pub const SILENT_WAV: &str =
    "UklGRiwAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQgAAACAgICAgICAgA==";

/// The conformance fixtures.
#[derive(Debug, Default)]
pub struct Conformance;

fn no_args() -> Value {
    json!({"type": "object", "additionalProperties": false, "properties": {}})
}

fn one_string(name: &str) -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": [name],
        "properties": {name: {"type": "string", "maxLength": 2000}}
    })
}

fn conformance_tools() -> Vec<Tool> {
    vec![
        tool("test_simple_text", "Returns one text block.", no_args()),
        tool("test_image_content", "Returns a PNG image.", no_args()),
        tool("test_audio_content", "Returns a WAV clip.", no_args()),
        tool(
            "test_embedded_resource",
            "Returns an embedded text resource.",
            no_args(),
        ),
        tool(
            "test_multiple_content_types",
            "Returns text, an image and a resource.",
            no_args(),
        ),
        tool(
            "test_tool_with_logging",
            "Sends three log notifications while it runs.",
            no_args(),
        ),
        tool(
            "test_tool_with_progress",
            "Reports progress 0, 50 and 100 of 100 when given a progress token.",
            no_args(),
        ),
        tool(
            "test_error_handling",
            "Always fails with isError.",
            no_args(),
        ),
        tool(
            "test_sampling",
            "Asks the client's model to answer a prompt.",
            one_string("prompt"),
        ),
        tool(
            "test_elicitation",
            "Asks the user for a username and an email address.",
            one_string("message"),
        ),
        tool(
            "test_elicitation_sep1034_defaults",
            "Elicits a form whose fields all carry defaults.",
            no_args(),
        ),
        tool(
            "test_elicitation_sep1330_enums",
            "Elicits a form with every enum variant.",
            no_args(),
        ),
        tool(
            "json_schema_2020_12_tool",
            "Tool with JSON Schema 2020-12 features",
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {
                    "address": {
                        "type": "object",
                        "properties": {"street": {"type": "string"}, "city": {"type": "string"}}
                    }
                },
                "properties": {
                    "name": {"type": "string"},
                    "address": {"$ref": "#/$defs/address"}
                },
                "additionalProperties": false
            }),
        ),
    ]
}

fn text(t: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(t)])
}

impl Domain for Conformance {
    fn name(&self) -> &'static str {
        "conformance"
    }

    fn server_name(&self) -> &'static str {
        "toolgate-fake-conformance"
    }

    fn tools(&self) -> Vec<Tool> {
        conformance_tools()
    }

    #[allow(deprecated)] // logging and sampling are deprecated in 2026-07-28, still tested
    fn capabilities(&self) -> ServerCapabilities {
        ServerCapabilities::builder()
            .enable_tools()
            .enable_logging()
            .build()
    }

    fn logs(&self) -> bool {
        true
    }

    async fn call(&self, call: &Call, context: &RequestContext<RoleServer>) -> Reply {
        let result = match call.tool.as_str() {
            "test_simple_text" => text("This is a simple text response for testing."),
            "test_image_content" => CallToolResult::success(vec![ContentBlock::image(
                RED_PIXEL_PNG,
                "image/png",
            )]),
            "test_audio_content" => {
                CallToolResult::success(vec![ContentBlock::audio(SILENT_WAV, "audio/wav")])
            }
            "test_embedded_resource" => CallToolResult::success(vec![ContentBlock::resource(
                ResourceContents::text(
                    "This is an embedded resource content.",
                    "test://embedded-resource",
                ),
            )]),
            "test_multiple_content_types" => CallToolResult::success(vec![
                ContentBlock::text("Multiple content types test:"),
                ContentBlock::image(RED_PIXEL_PNG, "image/png"),
                ContentBlock::resource(
                    ResourceContents::text(
                        r#"{"test":"data","value":123}"#,
                        "test://mixed-content-resource",
                    )
                    .with_mime_type("application/json"),
                ),
            ]),
            "test_tool_with_logging" => logging(context).await,
            "test_tool_with_progress" => progress(context).await,
            "test_error_handling" => {
                tool_error("This tool intentionally returns an error for testing")
            }
            "test_sampling" => match str_arg(&call.arguments, "prompt") {
                Ok(prompt) => sampling(context, prompt).await,
                Err(e) => e.into(),
            },
            "test_elicitation" => match str_arg(&call.arguments, "message") {
                Ok(message) => {
                    elicit(
                        context,
                        "User response",
                        json!({
                            "message": message,
                            "requestedSchema": {
                                "type": "object",
                                "properties": {
                                    "username": {"type": "string", "description": "User's response"},
                                    "email": {"type": "string", "description": "User's email address"}
                                },
                                "required": ["username", "email"]
                            }
                        }),
                    )
                    .await
                }
                Err(e) => e.into(),
            },
            "test_elicitation_sep1034_defaults" => {
                elicit(
                    context,
                    "Elicitation completed",
                    json!({
                        "message": "Please review and update the form fields with defaults",
                        "requestedSchema": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                                "age": {"type": "integer", "description": "User age", "default": 30},
                                "score": {"type": "number", "description": "User score", "default": 95.5},
                                "status": {
                                    "type": "string",
                                    "description": "User status",
                                    "enum": ["active", "inactive", "pending"],
                                    "default": "active"
                                },
                                "verified": {"type": "boolean", "description": "Verification status", "default": true}
                            }
                        }
                    }),
                )
                .await
            }
            "test_elicitation_sep1330_enums" => {
                elicit(
                    context,
                    "Elicitation completed",
                    json!({
                        "message": "Please select options from the enum fields",
                        "requestedSchema": {
                            "type": "object",
                            "properties": {
                                "untitledSingle": {
                                    "type": "string",
                                    "description": "Select one option",
                                    "enum": ["option1", "option2", "option3"]
                                },
                                "titledSingle": {
                                    "type": "string",
                                    "description": "Select one option with titles",
                                    "oneOf": [
                                        {"const": "value1", "title": "First Option"},
                                        {"const": "value2", "title": "Second Option"},
                                        {"const": "value3", "title": "Third Option"}
                                    ]
                                },
                                "legacyEnum": {
                                    "type": "string",
                                    "description": "Select one option (legacy)",
                                    "enum": ["opt1", "opt2", "opt3"],
                                    "enumNames": ["Option One", "Option Two", "Option Three"]
                                },
                                "untitledMulti": {
                                    "type": "array",
                                    "description": "Select multiple options",
                                    "minItems": 1,
                                    "maxItems": 3,
                                    "items": {"type": "string", "enum": ["option1", "option2", "option3"]}
                                },
                                "titledMulti": {
                                    "type": "array",
                                    "description": "Select multiple options with titles",
                                    "minItems": 1,
                                    "maxItems": 3,
                                    "items": {"anyOf": [
                                        {"const": "value1", "title": "First Choice"},
                                        {"const": "value2", "title": "Second Choice"},
                                        {"const": "value3", "title": "Third Choice"}
                                    ]}
                                }
                            }
                        }
                    }),
                )
                .await
            }
            "json_schema_2020_12_tool" => text(format!(
                "Received: {}",
                Value::Object(call.arguments.clone())
            )),
            other => tool_error(format!("unknown tool '{other}'")),
        };
        Reply::read(result)
    }
}

#[allow(deprecated)]
async fn logging(context: &RequestContext<RoleServer>) -> CallToolResult {
    let messages = [
        "Tool execution started",
        "Tool processing data",
        "Tool execution completed",
    ];
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = context
            .peer
            .notify_logging_message(LoggingMessageNotificationParam::new(
                LoggingLevel::Info,
                json!(m),
            ))
            .await;
    }
    text("Tool with logging executed successfully")
}

async fn progress(context: &RequestContext<RoleServer>) -> CallToolResult {
    let token = context.meta.get_progress_token();
    for (i, p) in [0.0, 50.0, 100.0].into_iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some(token) = &token {
            let _ = context
                .peer
                .notify_progress(ProgressNotificationParam::new(token.clone(), p).with_total(100.0))
                .await;
        }
    }
    text("Tool with progress executed successfully")
}

#[allow(deprecated)]
async fn sampling(context: &RequestContext<RoleServer>, prompt: &str) -> CallToolResult {
    let supports = context
        .peer
        .peer_info()
        .is_some_and(|info| info.capabilities.sampling.is_some());
    if !supports {
        return tool_error("the client does not support sampling");
    }
    let params = CreateMessageRequestParams::new(vec![SamplingMessage::user_text(prompt)], 100);
    match context.peer.create_message(params).await {
        Ok(result) => {
            let answer = result
                .message
                .content
                .first()
                .and_then(|c| c.as_text())
                .map(|t| t.text.clone())
                .unwrap_or_default();
            text(format!("LLM response: {answer}"))
        }
        Err(e) => tool_error(format!("sampling failed: {e}")),
    }
}

async fn elicit(
    context: &RequestContext<RoleServer>,
    label: &str,
    params: Value,
) -> CallToolResult {
    let supports = context
        .peer
        .peer_info()
        .is_some_and(|info| info.capabilities.elicitation.is_some());
    if !supports {
        return tool_error("the client does not support elicitation");
    }
    let request =
        ServerRequest::CustomRequest(CustomRequest::new("elicitation/create", Some(params)));
    match context.peer.send_request(request).await {
        Ok(result) => {
            let v = serde_json::to_value(&result).unwrap_or(Value::Null);
            let action = v.get("action").and_then(Value::as_str).unwrap_or("unknown");
            let content = v.get("content").cloned().unwrap_or(Value::Null);
            text(format!("{label}: action={action}, content={content}"))
        }
        Err(e) => tool_error(format!("elicitation failed: {e}")),
    }
}
