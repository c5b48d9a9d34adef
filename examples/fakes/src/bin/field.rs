//! `toolgate-fake-field`: the field-services system, as an MCP server over stdio (default) or
//! streamable HTTP (`--http ADDR`). See `--help` for the record and fault flags.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    toolgate_fakes::run(toolgate_fakes::field::Field::default()).await
}
