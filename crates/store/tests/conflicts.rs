//! A real PostgreSQL deadlock is recognised as a conflict the store may simply try again
//! (`StoreError::is_conflict`): two transactions lock two rows in opposite orders, PostgreSQL
//! aborts one with SQLSTATE 40P01, and that error is a conflict.

use crate::common::*;
use toolgate_store::StoreError;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_deadlock_is_a_conflict() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let schema = db.schema.clone().unwrap();
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA \"{schema}\"; CREATE TABLE \"{schema}\".t (id INT PRIMARY KEY, v INT); \
         INSERT INTO \"{schema}\".t VALUES (1, 0), (2, 0)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let update = |id: i32| format!("UPDATE \"{schema}\".t SET v = v + 1 WHERE id = {id}");

    let mut a = pool.begin().await.unwrap();
    let mut b = pool.begin().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(update(1)))
        .execute(&mut *a)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(update(2)))
        .execute(&mut *b)
        .await
        .unwrap();
    // Each now waits for the row the other holds; PostgreSQL aborts one of them.
    let (ra, rb) = tokio::join!(
        sqlx::raw_sql(sqlx::AssertSqlSafe(update(2))).execute(&mut *a),
        sqlx::raw_sql(sqlx::AssertSqlSafe(update(1))).execute(&mut *b),
    );
    let errors: Vec<StoreError> = [ra.err(), rb.err()]
        .into_iter()
        .flatten()
        .map(StoreError::Db)
        .collect();
    assert_eq!(errors.len(), 1, "exactly one transaction is aborted");
    assert!(errors[0].is_conflict(), "{}", errors[0]);
    drop((a, b));
    pool.close().await;
}
