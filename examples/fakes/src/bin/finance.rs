//! `toolgate-fake-finance`: the supplier-payments ERP and mailer, as an MCP server over stdio (default) or
//! streamable HTTP (`--http ADDR`). See `--help` for the record and fault flags.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    toolgate_fakes::run(toolgate_fakes::finance::Finance::default()).await
}
