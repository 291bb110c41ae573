//! Where a provider's turn reports: each call is one machine input for the
//! operation the turn belongs to (output of any other is ignored there).

use std::sync::Arc;

use pedelec_protocol::{OperationId, pb};

use super::Session;
use crate::providers::{BoxFuture, TurnSink};

pub struct OperationSink {
    pub session: Arc<Session>,
    pub operation: OperationId,
}

impl TurnSink for OperationSink {
    fn ready(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.session.flow())
    }

    fn delta(&self, text: &str) {
        self.session.step(|m, now, out| m.delta(&self.operation, text, now, out));
    }

    fn message(&self, text: &str) {
        self.session.step(|m, now, out| m.message(&self.operation, text, now, out));
    }

    fn usage(&self, total_tokens: u64) {
        self.session.step(|m, now, out| m.usage_reported(&self.operation, total_tokens, now, out));
    }

    fn provider_session(&self, id: &str) {
        self.session.step(|m, _, _| m.provider_session(&self.operation, id));
    }

    fn activity(&self, activity: pb::Activity) {
        self.session.step(|m, now, out| m.activity(&self.operation, activity, now, out));
    }

    fn tool_failed(&self, tool: &str, reason: &str) {
        self.session.step(|m, now, out| m.tool_failed(&self.operation, tool, reason, now, out));
    }

    fn steered(&self, text: &str) {
        self.session.step(|m, now, out| m.steered(&self.operation, text, now, out));
    }

    fn reports_tool_calls(&self) {
        self.session.fence.arm();
    }

    fn agent_called_out(&self) -> bool {
        self.session.lock().machine.agent_called_out(&self.operation)
    }

    fn tool_call_reported(&self, tool: &str) {
        self.session.fence.report(tool);
    }

    fn call_tool<'a>(&'a self, tool: &'a str, args_json: String) -> BoxFuture<'a, Result<String, pb::Error>> {
        Box::pin(self.session.call_tool(Some(&self.operation), tool, args_json))
    }
}
