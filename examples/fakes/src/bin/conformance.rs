//! `toolgate-fake-conformance`: the MCP conformance suite's fixture tools, as an MCP server over stdio (default) or
//! streamable HTTP (`--http ADDR`). See `--help` for the record and fault flags.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    toolgate_fakes::run(toolgate_fakes::conformance::Conformance).await
}
