//! The test model server on its own, for trying an agent by hand:
//! prints `http://127.0.0.1:PORT` and serves the standard script until killed.
//! Each request is logged to stderr as one JSON line.

use pedelec_test_agents::model_server::{ModelServer, standard_script};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let script = standard_script();
    let logged: pedelec_test_agents::model_server::Script = std::sync::Arc::new(move |request| {
        let answer = script(request);
        eprintln!(
            "{}",
            serde_json::json!({"path": request.path, "api": format!("{:?}", request.api),
                               "tools": request.tool_names(), "history": request.history().len(),
                               "reply": format!("{:?}", answer.reply)})
        );
        answer
    });
    let server = ModelServer::start(logged).await?;
    println!("{}", server.origin());
    std::future::pending::<()>().await;
    Ok(())
}
