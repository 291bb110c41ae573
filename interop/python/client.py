"""A third-party client of Pedelec Core, written from proto/ and its comments alone.

Generates the Python modules from proto/pedelec/v1 with grpcio-tools, then
drives one whole session over Core's Unix socket: ping, create a session with
a frontend tool, subscribe, send a text whose turn calls the tool, answer it,
wait for the completion, read the history, decode errors with grpc_status
(the pedelec.v1.Error in the google.rpc.Status details), move an asset both
ways through the asset hand-off socket (a file descriptor passed with
SCM_RIGHTS), cancel, list sessions, end. Prints one line per step; exits non-zero on the first failure.

    python client.py SOCKET

The `read` mode is the reader of `cargo xtask bench` (readers_bench, issue
40): it subscribes to another program's session, prints READY once it holds
the first snapshot, then reads as fast as Python can until the turn's
OperationCompleted arrives, and prints one JSON line with what it counted.

    python client.py SOCKET read SESSION_ID ORIGIN
"""

import json
import os
import queue
import socket as sockets
import struct
import sys
import tempfile
import threading
import time

from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join(HERE, "..", "..", "proto")
ORIGIN = "app:python-interop"


def generate():
    out = tempfile.mkdtemp(prefix="pedelec-py-")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    files = [os.path.join(PROTO, "pedelec", "v1", name) for name in ("session.proto", "core.proto")]
    code = protoc.main(["protoc", f"-I{PROTO}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}", *files])
    if code != 0:
        sys.exit(f"protoc failed ({code})")
    sys.path.insert(0, out)


def check(condition, what):
    if not condition:
        sys.exit(f"FAILED: {what}")
    print(f"ok: {what}")


def main(socket):
    generate()
    import grpc
    from grpc_status import rpc_status
    from pedelec.v1 import core_pb2, core_pb2_grpc, session_pb2

    # The proto's header: a plain host name as :authority.
    channel = grpc.insecure_channel(f"unix://{socket}", options=[("grpc.default_authority", "localhost")])
    core = core_pb2_grpc.CoreStub(channel)

    pong = core.Ping(core_pb2.PingRequest(), timeout=10)
    check(pong.version != "" and pong.pid > 0, f"Ping answers version {pong.version}")

    tool = session_pb2.ToolDefinition(
        name="lookup",
        description="Looks a key up",
        input_schema_json=json.dumps({"type": "object", "properties": {"key": {"type": "string"}}}),
        read_only_hint=True,
    )
    created = core.CreateSession(
        core_pb2.CreateSessionRequest(
            provider="scripted", skills=session_pb2.Skills(tools=[tool]), caller_origin=ORIGIN, auto_end_on_disconnect=False
        ),
        timeout=10,
    )
    session_id = created.session.session_id
    check(session_id.startswith("sess-"), "CreateSession answers a session id")

    events = queue.Queue()
    stream = core.Subscribe(core_pb2.SubscribeRequest(session_id=session_id, caller_origin=ORIGIN))
    threading.Thread(target=lambda: [events.put(e) for e in stream], daemon=True).start()
    first = events.get(timeout=10)
    check(first.WhichOneof("kind") == "snapshot", "the first event is a snapshot")

    accepted = core.SendText(
        core_pb2.SendTextRequest(session_id=session_id, caller_origin=ORIGIN, text='/tool lookup {"key": "k"}'),
        timeout=10,
    )
    check(accepted.operation_id != "", "SendText returns an operation id")
    chat, completed, last_seq = None, None, first.seq
    while completed is None:
        event = events.get(timeout=20)
        if event.seq <= last_seq:
            sys.exit(f"FAILED: seq {event.seq} after {last_seq}: every event's seq grows")
        last_seq = event.seq
        kind = event.WhichOneof("kind")
        if kind == "tool_call":
            args = json.loads(event.tool_call.args_json)
            core.SubmitToolResult(
                core_pb2.SubmitToolResultRequest(
                    session_id=session_id,
                    caller_origin=ORIGIN,
                    tool_request_id=event.tool_call.tool_request_id,
                    result_json=json.dumps({"value": args["key"].upper()}, separators=(",", ":")),
                ),
                timeout=10,
            )
        elif kind == "chat":
            chat = event.chat.text
        elif kind == "operation_completed" and event.operation_id == accepted.operation_id:
            completed = event.operation_completed
    check(not completed.HasField("error"), "the operation completes without an error")
    check(chat is not None and '{"value":"K"}' in chat, f"the tool's result reached the agent: {chat!r}")

    history = core.GetHistory(core_pb2.GetHistoryRequest(session_id=session_id, caller_origin=ORIGIN), timeout=10)
    kinds = [entry.WhichOneof("kind") for entry in history.entries]
    check("tool_call" in kinds and "tool_result" in kinds and "assistant_message" in kinds, f"GetHistory: {kinds}")

    # Errors: the gRPC rich error model, decoded with stock grpc_status.
    try:
        core.SendText(core_pb2.SendTextRequest(session_id="sess-nope", caller_origin=ORIGIN, text="x"), timeout=10)
        check(False, "an unknown session is refused")
    except grpc.RpcError as error:
        status = rpc_status.from_call(error)
        check(status is not None and len(status.details) == 1, "the status details hold one Any")
        detail = session_pb2.Error()
        check(status.details[0].Unpack(detail), f"the Any is a {status.details[0].type_url}")
        check(detail.code == "THREAD_NOT_FOUND" and error.code() == grpc.StatusCode.NOT_FOUND, f"code {detail.code}")

    handoff(core, core_pb2, session_id)

    nothing = core.Cancel(core_pb2.CancelRequest(session_id=session_id, caller_origin=ORIGIN), timeout=10)
    check(nothing.operation_id == "", "Cancel with nothing running is a no-op")
    listed = core.ListSessions(core_pb2.ListSessionsRequest(caller_origin=ORIGIN), timeout=10)
    check([s.session.session_id for s in listed.sessions] == [session_id], "ListSessions: this origin's one session")
    ended = core.End(core_pb2.EndRequest(session_id=session_id, caller_origin=ORIGIN), timeout=10)
    check(ended.ended_now, "End ends the session")

    # The activity log, as the user reads it (owner calls: an `app:` caller origin).
    owner = "app:pedelec-interop-owner"
    log = core.ListActivity(core_pb2.ListActivityRequest(caller_origin=owner, origin=ORIGIN, limit=100), timeout=10)
    kinds = [core_pb2.ActivityLogKind.Name(e.kind) for e in reversed(log.entries)]
    check(kinds[0] == "ACTIVITY_LOG_KIND_SESSION_STARTED" and kinds[-1] == "ACTIVITY_LOG_KIND_SESSION_ENDED", f"ListActivity: {kinds}")
    calls = [e for e in log.entries if e.kind == core_pb2.ACTIVITY_LOG_KIND_TOOL_CALLED]
    check(len(calls) == 1 and calls[0].read_only and calls[0].session_id == session_id, "the tool call, tagged read-only")
    exported = core.ExportActivity(core_pb2.ExportActivityRequest(caller_origin=owner, origin=ORIGIN), timeout=10)
    lines = [json.loads(line) for line in exported.jsonl.splitlines()]
    check(len(lines) == len(log.entries) and lines[0]["sessionId"] == session_id, "ExportActivity: JSON lines")
    try:
        core.ListActivity(core_pb2.ListActivityRequest(caller_origin="https://page.example"), timeout=10)
        check(False, "a web origin may not read the activity log")
    except grpc.RpcError as error:
        check(error.code() == grpc.StatusCode.PERMISSION_DENIED, "ListActivity refuses a web origin")
    stream.cancel()
    print("PYTHON_INTEROP_OK")


def frame(message):
    body = message.SerializeToString()
    return struct.pack("<I", len(body)) + body


def exchange(path, request, fds):
    """One hand-off exchange: a request frame (with `fds` beside it), then the answer and its files."""
    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(path)
        sockets.send_fds(conn, [frame(request)], fds)
        data, files = b"", []
        while len(data) < 4 or len(data) < 4 + struct.unpack("<I", data[:4])[0]:
            chunk, more, _, _ = sockets.recv_fds(conn, 65536, 4)
            if not chunk:
                break
            data, files = data + chunk, files + more
        return data, files


def handoff(core, core_pb2, session_id):
    payload = os.urandom(300_000)
    with tempfile.TemporaryFile() as source:
        source.write(payload)
        source.flush()
        ticket = core.CreateAssetUpload(
            core_pb2.CreateAssetUploadRequest(
                session_id=session_id, caller_origin=ORIGIN, target_path="/py/blob.bin", size=len(payload)
            ),
            timeout=10,
        )
        check(ticket.local_socket.endswith(".assets"), f"the upload ticket names the hand-off socket {ticket.local_socket}")
        request = core_pb2.AssetHandoffRequest(url=ticket.url, token=ticket.token)
        data, files = exchange(ticket.local_socket, request, [source.fileno()])
    answer = core_pb2.AssetHandoffResponse.FromString(data[4:])
    check(answer.WhichOneof("result") == "path" and answer.path == "/py/blob.bin" and not files, f"upload: {answer}")
    ticket = core.CreateAssetDownload(
        core_pb2.CreateAssetDownloadRequest(session_id=session_id, caller_origin=ORIGIN, path="/py/blob.bin"), timeout=10
    )
    data, files = exchange(ticket.local_socket, core_pb2.AssetHandoffRequest(url=ticket.url, token=ticket.token), [])
    answer = core_pb2.AssetHandoffResponse.FromString(data[4:])
    check(answer.WhichOneof("result") == "size" and answer.size == len(payload) and len(files) == 1, f"download: {answer}")
    back = os.pread(files[0], answer.size, 0)
    os.close(files[0])
    check(back == payload, "the downloaded file holds the uploaded bytes")
    again, files = exchange(ticket.local_socket, core_pb2.AssetHandoffRequest(url=ticket.url, token=ticket.token), [])
    refused = core_pb2.AssetHandoffResponse.FromString(again[4:])
    check(refused.WhichOneof("result") == "error" and refused.error.code == "ASSET_TICKET_INVALID" and not files, "a ticket is single-use")


def read(socket, session_id, origin, deadline_s=300):
    generate()
    import grpc
    from pedelec.v1 import core_pb2, core_pb2_grpc

    channel = grpc.insecure_channel(f"unix://{socket}", options=[("grpc.default_authority", "localhost")])
    core = core_pb2_grpc.CoreStub(channel)
    stream = core.Subscribe(core_pb2.SubscribeRequest(session_id=session_id, caller_origin=origin))
    # Bounded: a turn whose completion never arrives still ends in a JSON line
    # (completed false) instead of a hung bench.
    timer = threading.Timer(deadline_s, stream.cancel)
    timer.daemon = True
    timer.start()
    counts = {"deltas": 0, "chat": 0, "completed": False, "resyncs": 0, "error": None}
    snapshots, started = 0, None
    try:
        for event in stream:
            kind = event.WhichOneof("kind")
            if kind == "snapshot":
                snapshots += 1
                if snapshots == 1:
                    print("READY", flush=True)
                    started = time.monotonic()
                else:
                    # A re-sync: this reader fell out of Core's event log.
                    counts["resyncs"] += 1
            elif kind == "chat_delta":
                counts["deltas"] += 1
            elif kind == "chat":
                counts["chat"] += 1
            elif kind == "operation_completed":
                counts["completed"] = True
                break
    except grpc.RpcError as error:
        counts["error"] = f"{error.code()}: {error.details()}"
    timer.cancel()
    stream.cancel()
    counts["seconds"] = round(time.monotonic() - started, 3) if started is not None else None
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[2] == "read":
        read(sys.argv[1], sys.argv[3], sys.argv[4])
    else:
        main(sys.argv[1])
