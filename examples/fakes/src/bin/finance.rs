//! `toolgate-fake-finance`: the supplier-payments ERP and mailer, as an MCP server over stdio (default) or
//! streamable HTTP (`--http ADDR`). See `--help` for the record and fault flags.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // TOOLGATE_FAKE_FINANCE_BULK set: every INV-9xxxxxxx is an approved invoice too (queues of
    // many distinct payments for tests and benchmarks through the real binary).
    let finance = if std::env::var_os("TOOLGATE_FAKE_FINANCE_BULK").is_some() {
        toolgate_fakes::finance::Finance::with_bulk_invoices()
    } else {
        toolgate_fakes::finance::Finance::default()
    };
    toolgate_fakes::run(finance).await
}
