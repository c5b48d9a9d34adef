//! A PostgreSQL database of a bench's own on a shared server: created fresh at the start, dropped
//! (whoever is still connected) at the end.

use toolgate_store::Store;

pub(crate) struct BenchDatabase {
    admin: Store,
    name: String,
    /// The database's URL, on the same server as the admin URL.
    pub(crate) url: String,
}

impl BenchDatabase {
    /// Creates `toolgate_<bench>_<pid>` on the server of `server` (a URL whose user may create
    /// databases), dropping a leftover of the same name first.
    pub(crate) async fn create(server: &str, bench: &str) -> anyhow::Result<BenchDatabase> {
        let name = format!("toolgate_{bench}_{}", std::process::id());
        let admin = Store::connect(server, Default::default()).await?;
        admin
            .execute_raw(&format!("DROP DATABASE IF EXISTS {name}"))
            .await?;
        admin
            .execute_raw(&format!("CREATE DATABASE {name}"))
            .await?;
        let base = server.rsplit_once('/').map_or(server, |(b, _)| b);
        let url = format!("{base}/{name}");
        Ok(BenchDatabase { admin, name, url })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Ends every connection to the database but the admin's own, as a restart of the server
    /// would.
    pub(crate) async fn terminate_connections(&self) -> anyhow::Result<()> {
        self.admin
            .execute_raw(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = '{}' AND pid <> pg_backend_pid()",
                self.name
            ))
            .await?;
        Ok(())
    }

    /// Drops the database, closing whatever still holds it.
    pub(crate) async fn drop(self) {
        let _ = self
            .admin
            .execute_raw(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await;
        self.admin.close().await;
    }
}
