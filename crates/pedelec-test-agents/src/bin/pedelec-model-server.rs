//! The test model server on its own, for trying an agent by hand:
//! prints `http://127.0.0.1:PORT` and serves the standard script until killed.
//! Each request is logged to stderr as one JSON line once answered (with its
//! whole body when `PEDELEC_MODEL_SERVER_BODIES` is set).

use std::time::Duration;

use pedelec_test_agents::model_server::{ModelServer, standard_script};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let bodies = std::env::var_os("PEDELEC_MODEL_SERVER_BODIES").is_some();
    let server = ModelServer::start(standard_script()).await?;
    println!("{}", server.origin());
    let mut logged = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        for r in server.recorded().into_iter().skip(logged) {
            logged += 1;
            let request = &r.request;
            let mut line = serde_json::json!({"path": request.path, "api": format!("{:?}", request.api),
                               "tools": request.tool_names(), "history": request.history().len(),
                               "reply": format!("{:?}", r.answer.map(|a| a.reply))});
            if bodies {
                line["body"] = request.body.clone();
            }
            eprintln!("{line}");
        }
    }
}
