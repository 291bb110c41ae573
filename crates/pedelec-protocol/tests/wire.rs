//! The canonical JSON of one of each request, response and event, as native
//! messaging carries it, plus round trips through JSON and protobuf bytes.

use pedelec_protocol::ErrorCode;
use pedelec_protocol::json::{from_json, to_json};
use pedelec_protocol::pb::{self, native_frame::Body, native_request::Call, native_response::Result as R};
use prost::Message;

fn check<T>(name: &str, message: &T)
where
    T: Message + Default + PartialEq + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let text = to_json(message);
    let back: T = from_json(&text).unwrap();
    assert_eq!(&back, message, "JSON round trip of {name}");
    let bytes = message.encode_to_vec();
    assert_eq!(&T::decode(bytes.as_slice()).unwrap(), message, "protobuf round trip of {name}");
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    insta::assert_snapshot!(name, serde_json::to_string_pretty(&value).unwrap());
}

fn request(id: u32, call: Call) -> pb::NativeFrame {
    pb::NativeFrame {
        request_id: id,
        body: Some(Body::Request(pb::NativeRequest { call: Some(call) })),
        ..Default::default()
    }
}

fn response(id: u32, result: R) -> pb::NativeFrame {
    pb::NativeFrame {
        request_id: id,
        body: Some(Body::Response(pb::NativeResponse { result: Some(result) })),
        ..Default::default()
    }
}

fn turn() -> Option<pb::TurnInfo> {
    Some(pb::TurnInfo { turn_id: "turn-1".into(), kind: pb::TurnKind::User as i32, started_at_ms: 1_764_000_000_000 })
}

fn event(seq: u64, op: &str, kind: pb::session_event::Kind) -> pb::NativeFrame {
    pb::NativeFrame {
        request_id: 0,
        body: Some(Body::Event(pb::SessionEvent {
            session_id: "sess-1".into(),
            seq,
            emitted_at_ms: 1_764_000_000_123,
            turn: if op.is_empty() { None } else { turn() },
            operation_id: op.into(),
            kind: Some(kind),
        })),
        ..Default::default()
    }
}

#[test]
fn requests() {
    let tool = pb::ToolDefinition {
        name: "update_counter".into(),
        description: "Add delta to the counter".into(),
        input_schema_json: r#"{"type":"object","properties":{"delta":{"type":"number"}}}"#.into(),
        timeout_ms: 5000,
        read_only_hint: false,
    };
    check("request_ping", &request(1, Call::Ping(pb::PingRequest {})));
    check(
        "request_create_session",
        &request(
            2,
            Call::CreateSession(pb::CreateSessionRequest {
                provider: "scripted".into(),
                model: String::new(),
                effort_level: pb::EffortLevel::Low as i32,
                skills: Some(pb::Skills { guidance: "Be brief.".into(), tools: vec![tool] }),
                workspace: Some(pb::WorkspaceSpec { path: "/home/u/project".into(), ..Default::default() }),
                auto_end_on_disconnect: Some(false),
                caller_origin: "https://app.example".into(),
                permission_mode: pb::PermissionMode::App as i32,
            }),
        ),
    );
    let origin = "https://app.example".to_string();
    check(
        "request_send_text",
        &request(
            3,
            Call::SendText(pb::SendTextRequest {
                session_id: "sess-1".into(),
                caller_origin: origin.clone(),
                text: " hi ".into(),
                attachments: vec!["/screens/page.png".into()],
                ..Default::default()
            }),
        ),
    );
    check(
        "request_submit_tool_result",
        &request(
            4,
            Call::SubmitToolResult(pb::SubmitToolResultRequest {
                session_id: "sess-1".into(),
                caller_origin: origin.clone(),
                tool_request_id: "tool-1".into(),
                outcome: Some(pb::submit_tool_result_request::Outcome::ResultJson(r#"{"value":3}"#.into())),
            }),
        ),
    );
    check(
        "request_create_asset_upload",
        &request(
            5,
            Call::CreateAssetUpload(pb::CreateAssetUploadRequest {
                session_id: "sess-1".into(),
                caller_origin: origin,
                target_path: "/results/report.json".into(),
                file_name: "report.json".into(),
                size: 5_000_000_000,
            }),
        ),
    );
    check(
        "agent_call_tool",
        &pb::CallToolRequest { tool_token: "tok".into(), tool: "update_counter".into(), args_json: "{}".into() },
    );
}

#[test]
fn responses() {
    check(
        "response_accepted",
        &response(
            3,
            R::SendText(pb::OperationAccepted {
                operation_id: "op-1".into(),
                kind: pb::OperationKind::SendText as i32,
                already_done: false,
            }),
        ),
    );
    check(
        "response_list_providers",
        &response(
            6,
            R::ListProviders(pb::ListProvidersResponse {
                providers: vec![pb::ProviderInfo {
                    name: "Scripted".into(),
                    code: "scripted".into(),
                    available: true,
                    reason: String::new(),
                }],
            }),
        ),
    );
    check(
        "response_list_assets",
        &response(
            7,
            R::ListAssets(pb::ListAssetsResponse {
                assets: vec![pb::Asset {
                    name: "report.json".into(),
                    path: "/results/report.json".into(),
                    size: 42,
                    modified_at_ms: 1_764_000_000_000,
                    mime_type: "application/json".into(),
                }],
            }),
        ),
    );
    // A tool result whose success may come back as an acknowledgement,
    // and the acknowledgements riding on a frame, and alone.
    check(
        "request_deferred_ack",
        &pb::NativeFrame {
            defer_ack: true,
            ..request(
                9,
                Call::SubmitToolResult(pb::SubmitToolResultRequest {
                    session_id: "sess-1".into(),
                    caller_origin: "https://app.example".into(),
                    tool_request_id: "tool-1".into(),
                    outcome: Some(pb::submit_tool_result_request::Outcome::ResultJson("{}".into())),
                }),
            )
        },
    );
    check(
        "response_with_acks",
        &pb::NativeFrame {
            acks: vec![9, 11],
            ..response(12, R::Ping(pb::PingResponse { version: "0.1.0".into(), pid: 7 }))
        },
    );
    check("acks_alone", &pb::NativeFrame { acks: vec![13], ..Default::default() });
    check(
        "response_error",
        &pb::NativeFrame {
            request_id: 8,
            body: Some(Body::Error(pb::Error::new(pedelec_protocol::ErrorCode::SessionBusy, "a turn is active"))),
            ..Default::default()
        },
    );
}

#[test]
fn events() {
    use pb::session_event::Kind;
    let pending = pb::PendingToolCall {
        tool_request_id: "tool-1".into(),
        tool: "update_counter".into(),
        args_json: r#"{"delta":1}"#.into(),
        turn_id: "turn-1".into(),
        deadline_at_ms: 1_764_000_060_000,
    };
    let permission = pb::PermissionRequest {
        permission_id: "perm-1".into(),
        activity: Some(pb::Activity {
            activity_id: "call-8".into(),
            kind: pb::ActivityKind::FileEdit as i32,
            title: "Write /etc/hosts".into(),
            status: pb::ActivityStatus::Pending as i32,
            paths: vec!["/etc/hosts".into()],
            ..Default::default()
        }),
        options: vec![
            pb::PermissionOption {
                option_id: "allow".into(),
                name: "Allow".into(),
                kind: pb::PermissionOptionKind::AllowOnce as i32,
            },
            pb::PermissionOption {
                option_id: "reject".into(),
                name: "Reject".into(),
                kind: pb::PermissionOptionKind::RejectOnce as i32,
            },
        ],
        policy_option_id: "reject".into(),
        deadline_at_ms: 1_764_000_060_000,
        // Outside the workspace: only the user answers it.
        user_only: true,
    };
    let activity = pb::Activity {
        activity_id: "call-7".into(),
        kind: pb::ActivityKind::Command as i32,
        title: "Run the tests".into(),
        status: pb::ActivityStatus::InProgress as i32,
        command: "cargo test".into(),
        paths: vec!["crates/a/src/lib.rs".into()],
        output: "running 3 tests".into(),
        plan: vec![pb::PlanEntry { content: "Fix the bug".into(), status: pb::ActivityStatus::Completed as i32 }],
    };
    check(
        "event_snapshot",
        &event(
            0,
            "",
            Kind::Snapshot(pb::Snapshot {
                status: pb::SessionStatus::WaitingToolResult as i32,
                active_operation: Some(pb::ActiveOperation {
                    operation_id: "op-1".into(),
                    kind: pb::OperationKind::SendText as i32,
                }),
                turn: turn(),
                pending_tools: vec![pending],
                usage: Some(pb::Usage { total_tokens: Some(1234) }),
                last_seq: 41,
                provider: "scripted".into(),
                model: "scripted-1".into(),
                effort_level: pb::EffortLevel::Default as i32,
                prepared: true,
                created_at_ms: 1_764_000_000_000,
                activities: vec![activity.clone()],
                pending_permissions: vec![permission.clone()],
                recent_outcomes: vec![
                    pb::OperationOutcome {
                        operation_id: "op-0".into(),
                        kind: pb::OperationKind::Prepare as i32,
                        error: None,
                        ..Default::default()
                    },
                    pb::OperationOutcome {
                        operation_id: "op-00".into(),
                        kind: pb::OperationKind::Unspecified as i32,
                        error: Some(pb::Error::new(
                            ErrorCode::CoreRestarted,
                            "Core restarted while this operation ran",
                        )),
                        ..Default::default()
                    },
                ],
            }),
        ),
    );
    check(
        "event_status_changed",
        &event(
            42,
            "op-1",
            Kind::StatusChanged(pb::StatusChanged {
                status: pb::SessionStatus::Running as i32,
                previous: pb::SessionStatus::Idle as i32,
            }),
        ),
    );
    check(
        "event_operation_started",
        &event(43, "op-1", Kind::OperationStarted(pb::OperationStarted { kind: pb::OperationKind::SendText as i32 })),
    );
    check("event_chat_delta", &event(44, "op-1", Kind::ChatDelta(pb::ChatDelta { text: "Hel".into() })));
    check("event_chat", &event(45, "op-1", Kind::Chat(pb::Chat { text: "Hello".into() })));
    check(
        "event_tool_call",
        &event(
            46,
            "op-1",
            Kind::ToolCall(pb::ToolCall {
                tool_request_id: "tool-1".into(),
                tool: "update_counter".into(),
                args_json: r#"{"delta":1}"#.into(),
                deadline_at_ms: 1_764_000_060_000,
            }),
        ),
    );
    check(
        "event_usage_updated",
        &event(47, "op-1", Kind::UsageUpdated(pb::UsageUpdated { usage: Some(pb::Usage { total_tokens: Some(99) }) })),
    );
    check(
        "event_error",
        &event(
            48,
            "",
            Kind::Error(pb::ErrorRaised {
                error: Some(pb::Error::new(pedelec_protocol::ErrorCode::ProviderError, "model overloaded")),
            }),
        ),
    );
    check(
        "event_operation_completed",
        &event(
            49,
            "op-1",
            Kind::OperationCompleted(pb::OperationCompleted {
                kind: pb::OperationKind::SendText as i32,
                error: None,
                ..Default::default()
            }),
        ),
    );
    check("event_ended", &event(50, "", Kind::Ended(pb::Ended { reason: "requested".into() })));
    check("event_permission_requested", &event(52, "op-1", Kind::PermissionRequested(permission)));
    check(
        "event_permission_settled",
        &event(
            53,
            "op-1",
            Kind::PermissionSettled(pb::PermissionSettled {
                permission_id: "perm-1".into(),
                option_id: "allow".into(),
                reason: "answered".into(),
            }),
        ),
    );
    check(
        "event_activity_updated",
        &event(51, "op-1", Kind::ActivityUpdated(pb::ActivityUpdated { activity: Some(activity) })),
    );
}

#[test]
fn decoding_is_tolerant_of_unknown_fields_but_not_of_wrong_types() {
    let frame: pb::NativeFrame = from_json(r#"{"requestId":1,"futureField":true,"request":{"ping":{}}}"#).unwrap();
    assert_eq!(frame.request_id, 1);
    assert!(from_json::<pb::NativeFrame>(r#"{"requestId":"one"}"#).is_err());
    let seq_as_string: pb::SessionEvent = from_json(r#"{"seq":"18446744073709551615"}"#).unwrap();
    assert_eq!(seq_as_string.seq, u64::MAX);
}
