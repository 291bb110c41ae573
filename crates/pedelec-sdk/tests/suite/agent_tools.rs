//! The agent-facing `AgentTools` service: per-session tool tokens, several
//! calls pending at once, and refusals.

use std::sync::{Arc, Mutex};

use pedelec_protocol::grpc::error_from_status;
use pedelec_protocol::pb::{self, agent_tools_client::AgentToolsClient, call_tool_response::Outcome};
use pedelec_sdk::{SessionOptions, ToolSpec};
use serde_json::json;

use super::*;

async fn agent(h: &Harness) -> AgentToolsClient<tonic::transport::Channel> {
    AgentToolsClient::new(pedelec_sdk::grpc::local_channel(&h.socket()).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_lists_and_calls_its_own_sessions_tools_concurrently() {
    let h = Harness::start();
    let client = h.client().await;
    let tool = ToolSpec::new(
        "add".to_string(),
        "add one",
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    );
    let session = client
        .create_session(SessionOptions { tools: vec![tool], guidance: "be kind".into(), ..Default::default() })
        .await
        .unwrap();
    let token = h.tool_token(session.session_id());
    let mut agent = agent(&h).await;

    let listed = agent.list_tools(pb::ListToolsRequest { tool_token: token.clone() }).await.unwrap().into_inner();
    assert_eq!(listed.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), vec!["add"]);
    assert_eq!(listed.guidance, "be kind");

    let forged = agent.list_tools(pb::ListToolsRequest { tool_token: "0".repeat(64) }).await.unwrap_err();
    assert_eq!(error_from_status(&forged).code, "TOOL_TOKEN_INVALID");
    let call =
        |args: &str| pb::CallToolRequest { tool_token: token.clone(), tool: "add".into(), args_json: args.into() };
    let idle = agent.call_tool(call(r#"{"n":1}"#)).await.unwrap().into_inner();
    assert!(matches!(idle.outcome, Some(Outcome::Error(e)) if e.code == "SESSION_BUSY"), "no turn is active");

    // Hold both calls until both are pending, then answer them.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let _off = session.on_tool("add".to_string(), move |args: serde_json::Value, ctx| {
        let s = s.clone();
        async move {
            s.lock().unwrap().push(ctx.tool_request_id.clone());
            while s.lock().unwrap().len() < 2 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            Ok::<_, String>(json!(args["n"].as_i64().unwrap() + 1))
        }
    });
    let sess = session.clone();
    let turn = tokio::spawn(async move { sess.send_text("/sleep 1500").await });
    core_running(&h, &session).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let (mut a1, mut a2) = (agent.clone(), agent.clone());
    let (r1, r2) = tokio::join!(a1.call_tool(call(r#"{"n":1}"#)), a2.call_tool(call(r#"{"n":41}"#)));
    let mut results: Vec<String> = [r1, r2]
        .into_iter()
        .map(|r| match r.unwrap().into_inner().outcome {
            Some(Outcome::ResultJson(j)) => j,
            other => panic!("{other:?}"),
        })
        .collect();
    results.sort();
    assert_eq!(results, vec!["2", "42"]);
    assert_eq!(seen.lock().unwrap().len(), 2, "two calls were pending at once");
    let bad = agent.call_tool(call(r#"{"n":"x"}"#)).await.unwrap().into_inner();
    assert!(matches!(bad.outcome, Some(Outcome::Error(e)) if e.code == "TOOL_ARGS_INVALID"));
    turn.await.unwrap().unwrap();

    session.end().await.unwrap();
    let ended = agent.list_tools(pb::ListToolsRequest { tool_token: token }).await.unwrap_err();
    assert_eq!(error_from_status(&ended).code, "TOOL_TOKEN_INVALID", "an ended session's token is refused");
}
