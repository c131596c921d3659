//! Cost follows the work: every statement a timer runs, and those a request runs against a
//! table that grows with the store, goes through an index and a bounded range, on this
//! backend (SQLite, or PostgreSQL with sequential scans priced out). The list is
//! `spillway_server::db::plans::statements`.

use spillway_server::db::plans::statements;
use spillway_server::testing::TestServer;

#[tokio::test]
async fn timer_and_request_statements_use_an_index_and_a_bounded_range() {
    let srv = TestServer::start().await;
    let sqlite = srv.state.db.backend() == spillway_server::db::Backend::Sqlite;
    for st in statements() {
        let plan = srv.state.db.plan(&st.sql, &st.binds).await.unwrap_or_else(|e| panic!("{}: {e}", st.name));
        let index = if sqlite { st.index.0 } else { st.index.1 };
        let shown = plan.join("\n");
        eprintln!("{}:\n{shown}\n", st.name);
        assert!(plan.iter().any(|step| step.contains(index)), "{}: not through {index}:\n{shown}", st.name);
        if sqlite {
            // A table walked whole reads `SCAN <table>` with no index; a sort of every row
            // found, `USE TEMP B-TREE`.
            assert!(
                !plan.iter().any(|s| (s.starts_with("SCAN") && !s.contains("INDEX")) || s.contains("TEMP B-TREE")),
                "{}: walks or sorts every row:\n{shown}",
                st.name
            );
        } else {
            assert!(!shown.contains("Seq Scan"), "{}: walks every row:\n{shown}", st.name);
        }
    }
    srv.stop().await;
}
