//! The durable session store: SQLite (bundled), written by one thread.
//!
//! Request paths never wait on the disk except where durability is the point
//! (create, end, resume, an operation's start and completion): they hand a
//! job to the writer thread, which batches queued jobs into one transaction.
//! A batch nobody waits on stays open for [`GROUP_COMMIT_WINDOW`] (2 ms);
//! one with a waiter commits at once.
//!
//! Durability, stated: a job that fails rolls back only itself and only its
//! waiter hears of it; the rest of the batch commits. A job of several
//! statements runs inside its own savepoint for that; a job of exactly one
//! (an appended entry, a saved record) needs none, since SQLite undoes a
//! failed statement alone. A batch that someone waits on (`save_durably`,
//! `flush`) commits with `synchronous=FULL`, so the WAL is on disk before
//! the waiter is told; batches nobody waits on commit with `NORMAL` (still
//! atomic and consistent; at worst lost on power failure, never corrupt).
//! Because the writer runs jobs in submission order, a durable commit also
//! makes every job queued before it durable.

use std::path::Path;
#[cfg(test)]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use pedelec_protocol::{SessionId, SessionStatus, pb};
use rusqlite::{Connection, params};
use tokio::sync::oneshot;

use crate::error::{CoreError, CoreResult};
use crate::tool_token::ToolTokenDigest;
use crate::transcript::{Completion, EntryBody, EntryKind, TranscriptEntry};

/// Everything Core needs to bring a session back after a restart.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    pub id: SessionId,
    pub origin: String,
    pub provider: String,
    pub model: String,
    pub effort_level: pb::EffortLevel,
    pub created_at_ms: i64,
    pub workspace: String,
    pub managed_workspace: bool,
    pub auto_end_on_disconnect: bool,
    /// Stored as its number.
    pub permission_mode: pb::PermissionMode,
    /// Stored as the seed's status string.
    pub status: SessionStatus,
    pub provider_session_id: Option<String>,
    pub prepared: bool,
    pub usage_total: Option<u64>,
    /// Every seq Core emits for this session is at most this; a restart continues above it.
    pub seq_ceiling: u64,
    /// The digest of the session's tool token (the token itself is never
    /// stored: see `tool_token`).
    pub tool_token_digest: ToolTokenDigest,
    /// Operation running when the record was written, if any.
    pub active_operation: Option<String>,
    /// The session's skills and tools (`pb::Skills` as JSON), written once
    /// at creation. Core's own copy: the manifest file in the workspace is
    /// within the agent's reach, this is not. `None` in later writes
    /// (which keep the stored copy) and in rows older than the column.
    pub skills_json: Option<String>,
    /// The provider conversation this session continues a copy of (`Fork`):
    /// the parent's provider session id when it was forked; its first
    /// runtime forks from it. Written once, at creation.
    pub fork_of: Option<String>,
    /// The session it was forked from (`SessionInfo.forked_from`); empty
    /// for one that was not.
    pub forked_from: String,
    /// The bodies of the session's last `operation_completed` transcript
    /// entries, oldest first (at most `limits::RECENT_OUTCOMES`). Read from
    /// the transcript when the store opens; not a column, never written.
    pub recent_outcomes: Vec<Completion>,
    /// The bytes of the session's stored transcript bodies (what
    /// `max_transcript_bytes` limits). Read with `recent_outcomes`; not a
    /// column, never written.
    pub transcript_bytes: u64,
    /// When the record was last written (ms since epoch): for an ended
    /// session, when it ended. Set by the store on every write; read only.
    pub updated_at_ms: i64,
}

type Job = Box<dyn FnOnce(&Connection) -> rusqlite::Result<()> + Send>;

/// A job in the writer's queue.
struct Queued {
    work: Work,
    waiter: Option<Waiter>,
}

/// What a queued job runs. A job of exactly one SQL statement needs no
/// savepoint of its own: SQLite undoes a failed statement alone and keeps
/// the rest of the transaction (an appended message is then one statement
/// instead of three; a turn of many messages spent a third of the writer's
/// time on `SAVEPOINT` and `RELEASE`).
enum Work {
    /// A transcript row, inserted through the one statement the writer
    /// holds for the whole batch. Taken from the statement cache per row
    /// (hashing its SQL) and boxed as a closure, an appended message cost
    /// the writer — the bound of a codex turn — more than it had to.
    Append { session_id: String, entry: TranscriptEntry },
    /// A job of exactly one statement.
    Statement(Job),
    /// A job of several statements, run in a savepoint of its own.
    Isolated(Job),
}
/// Where the writer reports that a job's transaction committed (or why not).
type Ack = oneshot::Sender<Result<(), String>>;

/// Someone waiting on a job: for its commit to be durable (`synchronous=FULL`),
/// or only visible to other connections (a history read).
struct Waiter {
    ack: Ack,
    durable: bool,
}

/// Handle to the writer thread.
#[derive(Clone)]
pub struct Store {
    jobs: mpsc::Sender<Queued>,
    /// The writer thread, unparked by a job someone waits on: it may be
    /// holding a batch open ([`GROUP_COMMIT_WINDOW`]).
    writer: std::thread::Thread,
    faults: Arc<Faults>,
    /// A read-only connection for history pages (WAL: it reads beside the writer).
    reader: Arc<std::sync::Mutex<Connection>>,
}

pub use pedelec_protocol::history::HistoryQuery;

/// Failures on demand, for tests of what Core does when its disk fails.
/// Only test builds can arm them; elsewhere the checks are empty.
#[derive(Default)]
pub struct Faults {
    /// The next this many jobs fail (each rolls back only itself).
    #[cfg(test)]
    jobs: AtomicUsize,
    /// The next this many commits of an operation's completion fail.
    #[cfg(test)]
    completions: AtomicUsize,
}

impl Faults {
    /// Fails when a job failure is armed (taking it).
    fn job(&self) -> rusqlite::Result<()> {
        #[cfg(test)]
        if take(&self.jobs) {
            return Err(injected());
        }
        Ok(())
    }

    /// Fails when a completion failure is armed (taking it).
    fn completion(&self) -> rusqlite::Result<()> {
        #[cfg(test)]
        if take(&self.completions) {
            return Err(injected());
        }
        Ok(())
    }
}

/// Takes one armed failure, if any.
#[cfg(test)]
fn take(armed: &AtomicUsize) -> bool {
    armed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

#[cfg(test)]
fn injected() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
        Some("injected fault".into()),
    )
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    origin TEXT NOT NULL,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    effort_level INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    workspace TEXT NOT NULL,
    managed_workspace INTEGER NOT NULL,
    auto_end_on_disconnect INTEGER NOT NULL,
    status TEXT NOT NULL,
    provider_session_id TEXT,
    prepared INTEGER NOT NULL,
    usage_total INTEGER,
    seq_ceiling INTEGER NOT NULL,
    tool_token TEXT NOT NULL,
    active_operation TEXT,
    permission_mode INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS transcript (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    at_ms INTEGER NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS transcript_by_session ON transcript(session_id, seq);
-- Listing an origin's sessions reads only that origin's rows.
CREATE INDEX IF NOT EXISTS sessions_by_origin ON sessions(origin, created_at_ms);
CREATE INDEX IF NOT EXISTS transcript_completions ON transcript(session_id, seq) WHERE kind = 'operation_completed';
-- The user's consent per web origin (consent.rs): a pb::OriginConsent as JSON.
CREATE TABLE IF NOT EXISTS consent (
    origin TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
-- The activity log (activity_log.rs): appended, never changed; deleted
-- past the retention. AUTOINCREMENT: an id is never reused after a
-- purge, so a cursor (`act-<id>`) always means the same place.
CREATE TABLE IF NOT EXISTS activity (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    origin TEXT NOT NULL,
    session_id TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    kind TEXT NOT NULL,
    summary TEXT NOT NULL,
    detail TEXT NOT NULL,
    read_only INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS activity_by_origin ON activity(origin, id);
CREATE INDEX IF NOT EXISTS activity_by_time ON activity(at_ms);
";

/// Process-wide SQLite settings, for Core's binary to apply first thing in
/// `main`, while it has one thread and before any connection opens
/// (`sqlite3_config` is refused once SQLite initialised, and must not race
/// another thread's SQLite call).
///
/// It turns off SQLite's memory statistics: with them on, every allocation
/// SQLite makes takes a global mutex, and in a codex turn — the writer
/// thread inserting a row per message — `pthread_mutex_lock`/`unlock` were
/// a tenth of the writer's samples. Core never reads those statistics.
/// Returns whether SQLite took the setting (not once it has started).
pub fn configure_sqlite() -> bool {
    // SAFETY: called before SQLite initialises, with no other thread in it;
    // the option takes one int.
    let code = unsafe { rusqlite::ffi::sqlite3_config(rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS, 0 as std::ffi::c_int) };
    code == rusqlite::ffi::SQLITE_OK
}

fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // The writer raises this to FULL for each commit someone waits on.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "cache_size", -256)?;
    conn.execute_batch(SCHEMA)?;
    migrate(&conn)?;
    Ok(conn)
}

/// Columns added after a database may have been created: added with their
/// default, so an older state directory opens unchanged.
fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let has = |column: &str| -> rusqlite::Result<bool> {
        let mut stmt = conn.prepare("SELECT 1 FROM pragma_table_info('sessions') WHERE name = ?1")?;
        stmt.exists([column])
    };
    if !has("permission_mode")? {
        conn.execute_batch("ALTER TABLE sessions ADD COLUMN permission_mode INTEGER NOT NULL DEFAULT 0")?;
    }
    if !has("skills_json")? {
        // Rows from before it have none: their sessions fall back to the
        // manifest file once (`Registry::session_of`).
        conn.execute_batch("ALTER TABLE sessions ADD COLUMN skills_json TEXT")?;
    }
    if !has("fork_of")? {
        // Sessions from before `Fork` were never forked.
        conn.execute_batch("ALTER TABLE sessions ADD COLUMN fork_of TEXT")?;
        conn.execute_batch("ALTER TABLE sessions ADD COLUMN forked_from TEXT NOT NULL DEFAULT ''")?;
    }
    if !has("updated_at_ms")? {
        // Rows from before the column count as written now, so their
        // retention starts at the upgrade rather than expiring at once.
        conn.execute_batch("ALTER TABLE sessions ADD COLUMN updated_at_ms INTEGER NOT NULL DEFAULT 0")?;
        conn.execute("UPDATE sessions SET updated_at_ms = ?1", [crate::clock::now_ms()])?;
    }
    hash_plain_tool_tokens(conn)?;
    // Start-up reads live sessions only: an index over them alone keeps a
    // restart's cost independent of how many ended sessions are stored.
    conn.execute_batch("CREATE INDEX IF NOT EXISTS sessions_live ON sessions(created_at_ms) WHERE status != 'ended'")?;
    // The user's Recent list reads the newest ended sessions without
    // scanning every one kept.
    conn.execute_batch(
        "CREATE INDEX IF NOT EXISTS sessions_ended ON sessions(updated_at_ms, id) WHERE status = 'ended'",
    )?;
    Ok(())
}

/// A database from before tool tokens were hashed holds them in plain
/// text: each becomes its digest. The old bytes would survive in freed
/// space and in the WAL, so the file is then rewritten (`VACUUM`) and the
/// caller's checkpoint (`Store::open`) empties the WAL.
fn hash_plain_tool_tokens(conn: &Connection) -> rusqlite::Result<()> {
    let plain: Vec<(String, String)> = {
        let mut stmt = conn.prepare("SELECT id, tool_token FROM sessions WHERE tool_token NOT LIKE 'sha256:%'")?;
        stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?.collect::<rusqlite::Result<_>>()?
    };
    if plain.is_empty() {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let hashed = (|| {
        let mut update = conn.prepare("UPDATE sessions SET tool_token = ?2 WHERE id = ?1")?;
        for (id, token) in &plain {
            update.execute(params![id, ToolTokenDigest::from_stored(token).as_str()])?;
        }
        Ok(())
    })();
    match hashed {
        Ok(()) => conn.execute_batch("COMMIT")?,
        Err(error) => {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(error);
        }
    }
    conn.execute_batch("VACUUM")?;
    tracing::info!(sessions = plain.len(), "stored tool tokens replaced by their digests");
    Ok(())
}

impl Store {
    /// Opens (creating) the database and returns the stored sessions that
    /// have not ended (ended ones stay on disk until asked for).
    pub fn open(path: &Path) -> CoreResult<(Store, Vec<SessionRecord>)> {
        let conn = open_connection(path)?;
        // A WAL left by a Core that was killed is replayed by every open
        // until it is checkpointed: fold it into the database now, so the
        // next start reads an empty one (and the file does not stay large).
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        let records = load_live(&conn)?;
        let reader = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        reader.busy_timeout(std::time::Duration::from_secs(5))?;
        reader.pragma_update(None, "cache_size", -256)?;
        let (tx, rx) = mpsc::channel::<Queued>();
        let faults = Arc::new(Faults::default());
        let writer_faults = faults.clone();
        let writer = std::thread::Builder::new()
            .name("pedelec-store".into())
            .spawn(move || writer(conn, rx, &writer_faults))
            .map_err(|e| CoreError::io("starting the store thread", e))?
            .thread()
            .clone();
        Ok((Store { jobs: tx, writer, faults, reader: Arc::new(std::sync::Mutex::new(reader)) }, records))
    }

    /// Makes the next `jobs` jobs fail as a broken disk would.
    #[cfg(test)]
    pub fn fail_next_jobs(&self, jobs: usize) {
        self.faults.jobs.store(jobs, Ordering::SeqCst);
    }

    /// Makes the next `commits` commits that carry an operation's completion fail.
    #[cfg(test)]
    pub fn fail_next_completions(&self, commits: usize) {
        self.faults.completions.store(commits, Ordering::SeqCst);
    }

    /// Writes `entries` and then `records` as one job — all of them or, if
    /// it fails, none — queued at once (so it keeps its place in the order
    /// of the caller's other writes) and durable when the returned future
    /// resolves `Ok`.
    pub fn commit(
        &self,
        session_id: &SessionId,
        entries: Vec<TranscriptEntry>,
        records: Vec<SessionRecord>,
    ) -> impl std::future::Future<Output = CoreResult<()>> + Send + 'static {
        let id = session_id.as_str().to_owned();
        let faults = self.faults.clone();
        let completes = entries.iter().any(|e| e.kind == EntryKind::OperationCompleted);
        let waiter = self.submit_waited(
            true,
            Box::new(move |c| {
                if completes {
                    faults.completion()?;
                }
                for entry in &entries {
                    insert_entry(c, &id, entry)?;
                }
                for record in &records {
                    upsert(c, record)?;
                }
                Ok(())
            }),
        );
        async move { waiter?.await }
    }

    /// Queues a job that runs exactly one statement, without waiting.
    fn submit_statement(&self, job: Job) {
        let _ = self.jobs.send(Queued { work: Work::Statement(job), waiter: None });
    }

    async fn submit_and_wait(&self, job: Job) -> CoreResult<()> {
        self.submit_waited(true, job)?.await
    }

    /// Queues a job now; the future resolves once its batch committed.
    fn submit_waited(
        &self,
        durable: bool,
        job: Job,
    ) -> CoreResult<impl std::future::Future<Output = CoreResult<()>> + Send + 'static> {
        let stopped = || CoreError::new(pedelec_protocol::ErrorCode::Internal, "session store stopped");
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Queued { work: Work::Isolated(job), waiter: Some(Waiter { ack: tx, durable }) })
            .map_err(|_| stopped())?;
        self.writer.unpark();
        Ok(async move {
            match rx.await {
                Ok(result) => result.map_err(|e| CoreError::new(pedelec_protocol::ErrorCode::Internal, e)),
                Err(_) => Err(stopped()),
            }
        })
    }

    /// Every origin's stored consent (`consent.rs`), read at start.
    pub async fn consents(&self) -> CoreResult<Vec<pedelec_protocol::pb::OriginConsent>> {
        self.read(|c| {
            let mut stmt = c.prepare("SELECT body FROM consent ORDER BY origin")?;
            let bodies = stmt.query_map([], |row| row.get::<_, String>(0))?;
            let mut consents = Vec::new();
            for body in bodies {
                // A row that no longer parses grants nothing; it is skipped, not fatal.
                match serde_json::from_str(&body?) {
                    Ok(consent) => consents.push(consent),
                    Err(error) => tracing::warn!(%error, "skipping an unreadable stored consent"),
                }
            }
            Ok(consents)
        })
        .await
    }

    /// Stores one origin's consent durably (an unapproved origin with no
    /// folders is deleted), so a decision the user made survives a crash.
    pub async fn save_consent(&self, consent: pedelec_protocol::pb::OriginConsent) -> CoreResult<()> {
        self.submit_and_wait(Box::new(move |c| {
            if !consent.approved && consent.folders.is_empty() {
                c.execute("DELETE FROM consent WHERE origin = ?1", [&consent.origin])?;
            } else {
                let body = serde_json::to_string(&consent).unwrap_or_default();
                c.execute(
                    "INSERT INTO consent (origin, body) VALUES (?1, ?2)
                     ON CONFLICT(origin) DO UPDATE SET body = excluded.body",
                    params![consent.origin, body],
                )?;
            }
            Ok(())
        }))
        .await
    }

    /// Writes the whole record and waits until it is committed.
    pub async fn save_durably(&self, record: SessionRecord) -> CoreResult<()> {
        self.submit_and_wait(Box::new(move |c| upsert(c, &record))).await
    }

    /// Writes the whole record without waiting.
    pub fn save(&self, record: SessionRecord) {
        self.submit_statement(Box::new(move |c| upsert(c, &record)));
    }

    /// Keeps `skills_json` as the session's stored skills if it has none
    /// yet (a row from before Core kept its own copy), without waiting.
    /// Replaces the session's stored skills (`SetTools`), durably.
    pub async fn save_skills(&self, session_id: &SessionId, skills_json: String) -> CoreResult<()> {
        let id = session_id.as_str().to_owned();
        self.submit_statement(Box::new(move |c| {
            c.prepare_cached("UPDATE sessions SET skills_json = ?2 WHERE id = ?1")?
                .execute(params![id, skills_json])
                .map(drop)
        }));
        self.flush().await
    }

    pub fn adopt_skills(&self, session_id: &SessionId, skills_json: String) {
        let id = session_id.as_str().to_owned();
        self.submit_statement(Box::new(move |c| {
            c.prepare_cached("UPDATE sessions SET skills_json = ?2 WHERE id = ?1 AND skills_json IS NULL")?
                .execute(params![id, skills_json])
                .map(drop)
        }));
    }

    /// Appends a transcript entry without waiting.
    pub fn append(&self, session_id: &SessionId, entry: TranscriptEntry) {
        // The body was serialised on the caller's thread (`EntryBody`): the
        // one writer thread is the bound of a turn of many messages.
        let _ = self
            .jobs
            .send(Queued { work: Work::Append { session_id: session_id.as_str().to_owned(), entry }, waiter: None });
    }

    /// A page of `session_id`'s transcript: the newest `query.limit` entries
    /// with seq > `after_seq` and id < `before_id` (each with its id, the
    /// row id), oldest first, and whether older ones match too. Preparation
    /// entries are left out. Everything queued before the call is committed
    /// first, so a page includes what the caller has already seen happen.
    pub async fn history(
        &self,
        session_id: &SessionId,
        query: HistoryQuery,
    ) -> CoreResult<(Vec<(u64, TranscriptEntry)>, bool)> {
        self.visible().await?;
        let reader = self.reader.clone();
        let id = session_id.as_str().to_owned();
        let read = move || -> rusqlite::Result<(Vec<(u64, TranscriptEntry)>, bool)> {
            let conn = reader.lock().unwrap_or_else(|p| p.into_inner());
            let before = if query.before_id == 0 { i64::MAX } else { query.before_id.min(i64::MAX as u64) as i64 };
            let mut stmt = conn.prepare_cached(
                "SELECT rowid, seq, at_ms, kind, body FROM transcript
                 WHERE session_id = ?1 AND seq > ?2 AND rowid < ?3 AND kind NOT IN ('prepare', 'turn_changes')
                 ORDER BY seq DESC, rowid DESC LIMIT ?4",
            )?;
            // 0 is "from the start": entries recorded before the first event have seq 0.
            let after = if query.after_seq == 0 { -1 } else { query.after_seq.min(i64::MAX as u64) as i64 };
            let rows = stmt.query_map(params![id, after, before, i64::from(query.limit) + 1], |row| {
                let body: String = row.get(4)?;
                Ok((
                    row.get::<_, i64>(0)? as u64,
                    TranscriptEntry {
                        seq: row.get::<_, i64>(1)? as u64,
                        at_ms: row.get(2)?,
                        kind: EntryKind::parse(&row.get::<_, String>(3)?),
                        body: EntryBody::stored(body),
                    },
                ))
            })?;
            let mut page: Vec<(u64, TranscriptEntry)> = rows.collect::<rusqlite::Result<_>>()?;
            let has_more = page.len() > query.limit as usize;
            page.truncate(query.limit as usize);
            page.reverse();
            Ok((page, has_more))
        };
        tokio::task::spawn_blocking(read)
            .await
            .map_err(|e| CoreError::new(pedelec_protocol::ErrorCode::Internal, format!("reading history: {e}")))?
            .map_err(CoreError::from)
    }

    /// The changes recorded for `session_id`'s user turn `turn_id` (empty:
    /// its last), after everything queued before the call is committed.
    pub async fn turn_changes(
        &self,
        session_id: &SessionId,
        turn_id: &str,
    ) -> CoreResult<Option<pedelec_protocol::pb::GetChangesResponse>> {
        self.visible().await?;
        let reader = self.reader.clone();
        let id = session_id.as_str().to_owned();
        let turn = turn_id.to_owned();
        let read = move || -> rusqlite::Result<Option<pedelec_protocol::pb::GetChangesResponse>> {
            let conn = reader.lock().unwrap_or_else(|p| p.into_inner());
            let mut stmt = conn.prepare_cached(
                "SELECT body FROM transcript WHERE session_id = ?1 AND kind = 'turn_changes' ORDER BY seq DESC, rowid DESC",
            )?;
            let mut rows = stmt.query(params![id])?;
            while let Some(row) = rows.next()? {
                let body = EntryBody::stored(row.get::<_, String>(0)?);
                let Some(crate::transcript::TurnChanges(changes)) = body.parse() else { continue };
                if turn.is_empty() || changes.turn_id == turn {
                    return Ok(Some(changes));
                }
            }
            Ok(None)
        };
        tokio::task::spawn_blocking(read)
            .await
            .map_err(|e| CoreError::new(pedelec_protocol::ErrorCode::Internal, format!("reading changes: {e}")))?
            .map_err(CoreError::from)
    }

    /// One stored session with its recent outcomes, after everything queued
    /// before the call is visible (so a session that just left memory is
    /// read as it was last written).
    pub async fn load(&self, session_id: &SessionId) -> CoreResult<Option<SessionRecord>> {
        let id = session_id.as_str().to_owned();
        self.read(move |c| {
            let mut record = select_records(c, "WHERE id = ?1", [id.as_str()])?.pop();
            if let Some(record) = &mut record {
                record.recent_outcomes = recent_outcomes(c, record.id.as_str())?;
                record.transcript_bytes = transcript_bytes(c, record.id.as_str())?;
            }
            Ok(record)
        })
        .await
    }

    /// `origin`'s newest `limit` sessions created before `before` (a
    /// `(created_at_ms, id)` cursor), newest created first, ties by id.
    pub async fn list(
        &self,
        origin: &str,
        before: Option<(i64, String)>,
        limit: u32,
    ) -> CoreResult<Vec<SessionRecord>> {
        let origin = origin.to_owned();
        let (before_ms, before_id) = before.unwrap_or((i64::MAX, String::new()));
        self.read(move |c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM sessions WHERE origin = ?1
                   AND (created_at_ms < ?2 OR (created_at_ms = ?2 AND (?3 = '' OR id < ?3)))
                 ORDER BY created_at_ms DESC, id DESC LIMIT ?4"
            ))?;
            let rows = stmt.query_map(params![origin, before_ms, before_id, i64::from(limit)], record_of)?;
            rows.collect()
        })
        .await
    }

    /// The `limit` most recently ended sessions, of `origin` or (empty) of
    /// every origin: newest last written first (an ended session's last
    /// write is its end), ties by id. `ListLiveSessions` with `include_ended`.
    pub async fn ended(&self, origin: &str, limit: u32) -> CoreResult<Vec<SessionRecord>> {
        let origin = origin.to_owned();
        self.read(move |c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM sessions WHERE status = 'ended' AND (?1 = '' OR origin = ?1)
                 ORDER BY updated_at_ms DESC, id DESC LIMIT ?2"
            ))?;
            let rows = stmt.query_map(params![origin, i64::from(limit)], record_of)?;
            rows.collect()
        })
        .await
    }

    /// Deletes ended sessions last written before `cutoff_ms`, with their
    /// transcripts, except those in `keep` (sessions in memory). Returns the
    /// deleted records.
    pub async fn purge_ended(&self, cutoff_ms: i64, keep: Vec<SessionId>) -> CoreResult<Vec<SessionRecord>> {
        let deleted = Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = deleted.clone();
        self.submit_and_wait(Box::new(move |c| {
            let keep: std::collections::HashSet<SessionId> = keep.into_iter().collect();
            let expired: Vec<SessionRecord> =
                select_records(c, "WHERE status = 'ended' AND updated_at_ms < ?1", [cutoff_ms])?
                    .into_iter()
                    .filter(|r| !keep.contains(&r.id))
                    .collect();
            for record in &expired {
                c.prepare_cached("DELETE FROM transcript WHERE session_id = ?1")?.execute([record.id.as_str()])?;
                c.prepare_cached("DELETE FROM sessions WHERE id = ?1")?.execute([record.id.as_str()])?;
            }
            *out.lock().unwrap_or_else(|p| p.into_inner()) = expired;
            Ok(())
        }))
        .await?;
        let deleted = std::mem::take(&mut *deleted.lock().unwrap_or_else(|p| p.into_inner()));
        Ok(deleted)
    }

    /// Appends an activity log entry without waiting.
    pub fn append_activity(&self, entry: crate::activity_log::NewEntry) {
        self.submit_statement(Box::new(move |c| {
            c.prepare_cached(
                "INSERT INTO activity(origin, session_id, at_ms, kind, summary, detail, read_only)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                entry.origin,
                entry.session_id,
                entry.at_ms,
                crate::activity_log::kind_name(entry.kind),
                entry.summary,
                entry.detail_json,
                entry.read_only,
            ])
            .map(drop)
        }));
    }

    /// A page of the activity log, newest first, and whether older entries
    /// match too; everything queued before the call is included.
    pub async fn activity(&self, query: crate::activity_log::Query) -> CoreResult<(Vec<pb::ActivityLogEntry>, bool)> {
        self.read(move |c| {
            let before = query.before_id.unwrap_or(i64::MAX);
            let limit = i64::from(query.limit) + 1;
            let columns = "id, origin, session_id, at_ms, kind, summary, detail, read_only";
            let entry = |row: &rusqlite::Row<'_>| -> rusqlite::Result<pb::ActivityLogEntry> {
                Ok(pb::ActivityLogEntry {
                    id: row.get::<_, i64>(0)? as u64,
                    origin: row.get(1)?,
                    session_id: row.get(2)?,
                    at_ms: row.get(3)?,
                    kind: crate::activity_log::parse_kind(&row.get::<_, String>(4)?) as i32,
                    summary: row.get(5)?,
                    detail_json: row.get(6)?,
                    read_only: row.get(7)?,
                })
            };
            let mut page: Vec<pb::ActivityLogEntry> = match &query.origin {
                Some(origin) => c
                    .prepare_cached(&format!(
                        "SELECT {columns} FROM activity WHERE origin = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3"
                    ))?
                    .query_map(params![origin, before, limit], entry)?
                    .collect::<rusqlite::Result<_>>()?,
                None => c
                    .prepare_cached(&format!("SELECT {columns} FROM activity WHERE id < ?1 ORDER BY id DESC LIMIT ?2"))?
                    .query_map(params![before, limit], entry)?
                    .collect::<rusqlite::Result<_>>()?,
            };
            let has_more = page.len() > query.limit as usize;
            page.truncate(query.limit as usize);
            Ok((page, has_more))
        })
        .await
    }

    /// Deletes activity log entries made before `cutoff_ms`; returns how many.
    pub async fn purge_activity(&self, cutoff_ms: i64) -> CoreResult<usize> {
        let deleted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let out = deleted.clone();
        self.submit_and_wait(Box::new(move |c| {
            let n = c.prepare_cached("DELETE FROM activity WHERE at_ms < ?1")?.execute([cutoff_ms])?;
            out.store(n, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }))
        .await?;
        Ok(deleted.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Runs `read` on the reader connection once everything queued before
    /// the call is visible to it.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> CoreResult<T> {
        self.visible().await?;
        let reader = self.reader.clone();
        tokio::task::spawn_blocking(move || read(&reader.lock().unwrap_or_else(|p| p.into_inner())))
            .await
            .map_err(|e| CoreError::new(pedelec_protocol::ErrorCode::Internal, format!("reading the store: {e}")))?
            .map_err(CoreError::from)
    }

    /// Waits until every job queued before this call is committed.
    pub async fn flush(&self) -> CoreResult<()> {
        self.submit_and_wait(Box::new(|_| Ok(()))).await
    }

    /// Waits until every job queued before this call is committed and
    /// visible to other connections, without asking for durability.
    async fn visible(&self) -> CoreResult<()> {
        self.submit_waited(false, Box::new(|_| Ok(())))?.await
    }
}

/// Jobs in one transaction at most.
const MAX_BATCH: usize = 512;

/// How long a batch that nobody waits on stays open for more jobs. A turn
/// appends an entry every few hundred microseconds (a tool call and its
/// result, a chat message), and a wake-up and a commit per entry made the
/// writer the second-busiest thread of a tool loop on two cores. While the
/// batch is open the writer sleeps (jobs queue without waking it), and a
/// job with a waiter wakes it at once, so no waiter (a durable save, a
/// history read's `visible`) ever waits on this; what it moves is when
/// unwaited appends reach the disk, by at most this much (a crash could
/// already lose what was queued and not yet committed).
const GROUP_COMMIT_WINDOW: std::time::Duration = std::time::Duration::from_millis(2);

fn writer(conn: Connection, jobs: mpsc::Receiver<Queued>, faults: &Faults) {
    let mut synchronous_full = false;
    let mut backlog = false;
    while let Ok(first) = jobs.recv() {
        // Behind a full batch there is no point in waiting for more, and a
        // waited job further back must not wait a window as well.
        if first.waiter.is_none() && !backlog {
            // Woken early by a waited job's unpark (or a stale one: the
            // batch then just commits sooner).
            std::thread::park_timeout(GROUP_COMMIT_WINDOW);
        }
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        backlog = batch.len() == MAX_BATCH;
        // FULL only when someone waits on this commit (see the module docs).
        let wanted_full = batch.iter().any(|queued| queued.waiter.as_ref().is_some_and(|w| w.durable));
        if wanted_full != synchronous_full {
            let mode = if wanted_full { "FULL" } else { "NORMAL" };
            match conn.pragma_update(None, "synchronous", mode) {
                Ok(()) => synchronous_full = wanted_full,
                Err(error) => tracing::error!(%error, "could not set the store's synchronous mode"),
            }
        }
        let mut results: Vec<(Option<Waiter>, Result<(), String>)> = Vec::with_capacity(batch.len());
        let committed = (|| {
            conn.execute_batch("BEGIN")?;
            let mut insert = None;
            for Queued { work, waiter } in batch {
                results.push((waiter, run_work(&conn, &mut insert, work, faults)));
            }
            drop(insert);
            conn.execute_batch("COMMIT")
        })()
        .map_err(|e| e.to_string());
        if let Err(error) = &committed {
            tracing::error!(%error, "session store commit failed");
            let _ = conn.execute_batch("ROLLBACK");
        }
        for (waiter, result) in results {
            let result = committed.clone().and(result);
            if let Err(error) = &result
                && committed.is_ok()
            {
                tracing::error!(%error, "a session store job failed (only it was rolled back)");
            }
            if let Some(waiter) = waiter {
                let _ = waiter.ack.send(result);
            }
        }
    }
}

/// Runs one job so that, if it fails, only its writes are undone: a
/// one-statement job (an appended row among them) by SQLite's own
/// statement rollback, any other in a savepoint of its own. `insert` is the
/// batch's insert statement, prepared by the first row that needs it.
fn run_work<'c>(
    conn: &'c Connection,
    insert: &mut Option<rusqlite::CachedStatement<'c>>,
    work: Work,
    faults: &Faults,
) -> Result<(), String> {
    let fault = || faults.job();
    match work {
        Work::Append { session_id, entry } => fault().and_then(|()| {
            let statement = match insert {
                Some(statement) => statement,
                None => insert.insert(conn.prepare_cached(INSERT_ROW)?),
            };
            statement.execute(row_params(&session_id, &entry)).map(drop)
        }),
        Work::Statement(job) => fault().and_then(|()| job(conn)),
        Work::Isolated(job) => in_savepoint(conn, || fault().and_then(|()| job(conn))),
    }
    .map_err(|e| e.to_string())
}

fn in_savepoint(conn: &Connection, job: impl FnOnce() -> rusqlite::Result<()>) -> rusqlite::Result<()> {
    // Cached statements: parsing the savepoint's SQL anew for each job was
    // about 7 % of the writer's time on a turn of many small messages.
    let statement = |sql: &str| conn.prepare_cached(sql)?.execute([]).map(drop);
    statement("SAVEPOINT job")?;
    match job() {
        Ok(()) => statement("RELEASE job"),
        Err(error) => {
            statement("ROLLBACK TO job")?;
            statement("RELEASE job")?;
            Err(error)
        }
    }
}

fn insert_entry(c: &Connection, session_id: &str, entry: &TranscriptEntry) -> rusqlite::Result<()> {
    c.prepare_cached(INSERT_ROW)?.execute(row_params(session_id, entry))?;
    Ok(())
}

const INSERT_ROW: &str = "INSERT INTO transcript(session_id, seq, at_ms, kind, body) VALUES (?1, ?2, ?3, ?4, ?5)";

/// An entry's row, borrowed: its body is already the stored text.
fn row_params<'a>(session_id: &'a str, entry: &'a TranscriptEntry) -> impl rusqlite::Params + 'a {
    (session_id, entry.seq as i64, entry.at_ms, entry.kind.as_str(), entry.body.as_str())
}

fn upsert(c: &Connection, r: &SessionRecord) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO sessions(id, origin, provider, model, effort_level, created_at_ms, workspace, managed_workspace,
            auto_end_on_disconnect, status, provider_session_id, prepared, usage_total, seq_ceiling, tool_token, active_operation,
            permission_mode, updated_at_ms, skills_json, fork_of, forked_from)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)
         ON CONFLICT(id) DO UPDATE SET status = excluded.status, provider_session_id = excluded.provider_session_id,
            prepared = excluded.prepared, usage_total = excluded.usage_total,
            seq_ceiling = MAX(seq_ceiling, excluded.seq_ceiling), active_operation = excluded.active_operation,
            tool_token = excluded.tool_token, updated_at_ms = excluded.updated_at_ms,
            skills_json = COALESCE(excluded.skills_json, skills_json)",
    )?
    .execute(params![
        r.id.as_str(),
        r.origin,
        r.provider,
        r.model,
        r.effort_level as i32,
        r.created_at_ms,
        r.workspace,
        r.managed_workspace,
        r.auto_end_on_disconnect,
        r.status.as_str(),
        r.provider_session_id,
        r.prepared,
        r.usage_total.map(|u| u as i64),
        r.seq_ceiling as i64,
        r.tool_token_digest.as_str(),
        r.active_operation,
        r.permission_mode as i32,
        crate::clock::now_ms(),
        r.skills_json,
        r.fork_of,
        r.forked_from,
    ])?;
    Ok(())
}

const COLUMNS: &str = "id, origin, provider, model, effort_level, created_at_ms, workspace, managed_workspace,
    auto_end_on_disconnect, status, provider_session_id, prepared, usage_total, seq_ceiling, tool_token, active_operation,
    permission_mode, updated_at_ms, skills_json, fork_of, forked_from";

fn record_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRecord> {
    Ok(SessionRecord {
        id: SessionId::new(row.get::<_, String>(0)?),
        origin: row.get(1)?,
        provider: row.get(2)?,
        model: row.get(3)?,
        effort_level: pb::EffortLevel::try_from(row.get::<_, i32>(4)?).unwrap_or_default(),
        created_at_ms: row.get(5)?,
        workspace: row.get(6)?,
        managed_workspace: row.get(7)?,
        auto_end_on_disconnect: row.get(8)?,
        // A status this Core cannot read is a session it cannot continue.
        status: SessionStatus::parse(&row.get::<_, String>(9)?).unwrap_or(SessionStatus::Ended),
        provider_session_id: row.get(10)?,
        prepared: row.get(11)?,
        usage_total: row.get::<_, Option<i64>>(12)?.map(|u| u as u64),
        seq_ceiling: row.get::<_, i64>(13)? as u64,
        tool_token_digest: ToolTokenDigest::from_stored(&row.get::<_, String>(14)?),
        active_operation: row.get(15)?,
        permission_mode: pb::PermissionMode::try_from(row.get::<_, i32>(16)?).unwrap_or_default(),
        recent_outcomes: Vec::new(),
        transcript_bytes: 0,
        updated_at_ms: row.get(17)?,
        skills_json: row.get(18)?,
        fork_of: row.get(19)?,
        forked_from: row.get(20)?,
    })
}

fn select_records(c: &Connection, filter: &str, args: impl rusqlite::Params) -> rusqlite::Result<Vec<SessionRecord>> {
    let mut stmt = c.prepare_cached(&format!("SELECT {COLUMNS} FROM sessions {filter}"))?;
    let rows = stmt.query_map(args, record_of)?;
    rows.collect()
}

/// The sessions that have not ended, oldest first, each with its recent
/// outcomes; reads nothing of ended ones (see the `sessions_live` index).
fn load_live(c: &Connection) -> rusqlite::Result<Vec<SessionRecord>> {
    let mut records = select_records(c, "WHERE status != 'ended' ORDER BY created_at_ms", [])?;
    for record in &mut records {
        record.recent_outcomes = recent_outcomes(c, record.id.as_str())?;
        record.transcript_bytes = transcript_bytes(c, record.id.as_str())?;
    }
    Ok(records)
}

/// The bytes of a session's stored transcript bodies.
fn transcript_bytes(c: &Connection, session_id: &str) -> rusqlite::Result<u64> {
    c.prepare_cached("SELECT COALESCE(SUM(LENGTH(CAST(body AS BLOB))), 0) FROM transcript WHERE session_id = ?1")?
        .query_row([session_id], |row| row.get::<_, i64>(0))
        .map(|n| n.max(0) as u64)
}

/// A session's last `limits::RECENT_OUTCOMES` operation completions, oldest first.
/// The session's last completions, oldest first; a body that does not read
/// as one is left out.
fn recent_outcomes(c: &Connection, session_id: &str) -> rusqlite::Result<Vec<Completion>> {
    let mut stmt = c.prepare_cached(
        "SELECT body FROM transcript WHERE session_id = ?1 AND kind = 'operation_completed'
         ORDER BY seq DESC LIMIT ?2",
    )?;
    let limit = pedelec_protocol::limits::RECENT_OUTCOMES as i64;
    let rows = stmt.query_map(params![session_id, limit], |row| row.get::<_, String>(0))?;
    let mut out = Vec::new();
    for body in rows {
        out.extend(serde_json::from_str::<Completion>(&body?).ok());
    }
    out.reverse();
    Ok(out)
}

/// Reads one session's transcript (for inspection and tests; opens its own connection).
pub fn read_transcript(database: &Path, session_id: &str) -> CoreResult<Vec<TranscriptEntry>> {
    let conn = Connection::open_with_flags(database, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut stmt = conn.prepare("SELECT seq, at_ms, kind, body FROM transcript WHERE session_id = ?1 ORDER BY seq")?;
    let rows = stmt.query_map([session_id], |row| {
        let body: String = row.get(3)?;
        Ok(TranscriptEntry {
            seq: row.get::<_, i64>(0)? as u64,
            at_ms: row.get(1)?,
            kind: EntryKind::parse(&row.get::<_, String>(2)?),
            body: EntryBody::stored(body),
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// One stored session record (for inspection and tests; opens its own connection).
pub fn read_record(database: &Path, session_id: &str) -> CoreResult<Option<SessionRecord>> {
    let conn = Connection::open_with_flags(database, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut record = select_records(&conn, "WHERE id = ?1", [session_id])?.pop();
    if let Some(record) = &mut record {
        record.recent_outcomes = recent_outcomes(&conn, record.id.as_str())?;
        record.transcript_bytes = transcript_bytes(&conn, record.id.as_str())?;
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> SessionRecord {
        SessionRecord {
            id: id.into(),
            origin: "https://a.example".into(),
            provider: "scripted".into(),
            model: String::new(),
            effort_level: pb::EffortLevel::Unspecified,
            created_at_ms: 1,
            workspace: "/w".into(),
            managed_workspace: true,
            auto_end_on_disconnect: false,
            permission_mode: pb::PermissionMode::Policy,
            status: SessionStatus::Idle,
            provider_session_id: None,
            fork_of: None,
            forked_from: String::new(),
            prepared: false,
            usage_total: None,
            seq_ceiling: 0,
            tool_token_digest: ToolTokenDigest::of("t"),
            active_operation: None,
            skills_json: None,
            recent_outcomes: Vec::new(),
            transcript_bytes: 0,
            updated_at_ms: 0,
        }
    }

    #[tokio::test]
    async fn the_activity_log_pages_newest_first_per_origin_and_forgets_what_is_past_retention() {
        use crate::activity_log::{NewEntry, Query};
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(&dir.path().join("sessions.sqlite3")).unwrap();
        let entry = |origin: &str, at_ms: i64| NewEntry {
            origin: origin.into(),
            session_id: "sess-1".into(),
            at_ms,
            kind: pb::ActivityLogKind::CommandRun,
            summary: format!("ran at {at_ms}"),
            detail_json: "{}".into(),
            read_only: at_ms == 30,
        };
        for (origin, at) in [("https://a.example", 10), ("https://b.example", 20), ("https://a.example", 30)] {
            store.append_activity(entry(origin, at));
        }
        let query = |origin: Option<&str>, before_id: Option<i64>, limit: u32| Query {
            origin: origin.map(Into::into),
            before_id,
            limit,
        };
        let (all, more) = store.activity(query(None, None, 10)).await.unwrap();
        assert_eq!(all.iter().map(|e| e.at_ms).collect::<Vec<_>>(), vec![30, 20, 10], "newest first");
        assert!(!more);
        assert!(all[0].read_only && !all[1].read_only);
        assert_eq!(all[0].kind, pb::ActivityLogKind::CommandRun as i32);
        let (page, more) = store.activity(query(Some("https://a.example"), None, 1)).await.unwrap();
        assert_eq!((page.len(), page[0].at_ms, more), (1, 30, true));
        let (rest, more) = store.activity(query(Some("https://a.example"), Some(page[0].id as i64), 1)).await.unwrap();
        assert_eq!((rest.len(), rest[0].at_ms, more), (1, 10, false));

        assert_eq!(store.purge_activity(25).await.unwrap(), 2, "entries made before the cutoff go");
        let (left, _) = store.activity(query(None, None, 10)).await.unwrap();
        assert_eq!(left.iter().map(|e| e.at_ms).collect::<Vec<_>>(), vec![30]);
        store.append_activity(entry("https://a.example", 40));
        let (after, _) = store.activity(query(None, None, 10)).await.unwrap();
        assert!(after[0].id > all[0].id, "ids are never reused, so cursors keep their place");
    }

    #[tokio::test]
    async fn a_failing_job_fails_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.sqlite3");
        let (store, _) = Store::open(&path).unwrap();
        // Queued together, so the writer is likely to take them as one batch.
        store.save(record("sess-a"));
        let bad = store.submit_and_wait(Box::new(|c| c.execute_batch("INSERT INTO no_such_table VALUES (1)")));
        let good = store.save_durably(record("sess-b"));
        let (bad, good) = tokio::join!(bad, good);
        assert!(bad.is_err(), "the broken job reports its failure");
        good.expect("a job beside a broken one still commits");
        for id in ["sess-a", "sess-b"] {
            assert!(read_record(&path, id).unwrap().is_some(), "{id} is stored");
        }
    }

    #[tokio::test]
    async fn a_failing_one_statement_job_leaves_no_row_and_fails_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.sqlite3");
        let (store, _) = Store::open(&path).unwrap();
        store.save(record("sess-a"));
        // One statement that writes two rows, then breaks NOT NULL on the
        // third: SQLite must take back the two as well.
        store.submit_statement(Box::new(|c| {
            c.execute_batch(
                "INSERT INTO transcript(session_id, seq, at_ms, kind, body)
                 VALUES ('sess-a', 1, 0, 'chat', '{}'), ('sess-a', 2, 0, 'chat', '{}'), ('sess-a', 3, 0, NULL, '{}')",
            )
        }));
        store.append(
            &"sess-a".into(),
            TranscriptEntry { seq: 4, at_ms: 0, kind: EntryKind::Chat, body: EntryBody::new(&serde_json::json!({})) },
        );
        store.save_durably(record("sess-b")).await.expect("the batch commits around the failed statement");
        let seqs: Vec<u64> = read_transcript(&path, "sess-a").unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [4], "none of the failed statement's rows, the next append kept");
        assert!(read_record(&path, "sess-b").unwrap().is_some());
    }

    /// Appended rows share the batch's one insert statement: a failed
    /// append, and a failed job between appends, cost only themselves.
    #[tokio::test]
    async fn appends_in_one_batch_share_a_statement_and_fail_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.sqlite3");
        let (store, _) = Store::open(&path).unwrap();
        let entry = |seq: u64| TranscriptEntry {
            seq,
            at_ms: 0,
            kind: EntryKind::Chat,
            body: EntryBody::new(&serde_json::json!({ "text": format!("m{seq}") })),
        };
        store.fail_next_jobs(1);
        store.append(&"sess-a".into(), entry(1));
        store.append(&"sess-a".into(), entry(2));
        store.submit_statement(Box::new(|c| {
            c.execute_batch(
                "INSERT INTO transcript(session_id, seq, at_ms, kind, body) VALUES ('sess-a', 9, 0, NULL, '{}')",
            )
        }));
        store.append(&"sess-a".into(), entry(3));
        store.save_durably(record("sess-a")).await.expect("the batch commits around the failures");
        let stored = read_transcript(&path, "sess-a").unwrap();
        let seqs: Vec<u64> = stored.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [2, 3], "the failed append and the failed statement wrote nothing, the others did");
        assert_eq!(stored[1].body.json()["text"], "m3");
    }

    /// In a fresh process (nextest runs each test in one) the setting takes,
    /// and SQLite then keeps no memory statistics: its count of memory in
    /// use stays 0 while a store works.
    #[tokio::test]
    async fn sqlite_keeps_no_memory_statistics_once_configured() {
        let configured = configure_sqlite();
        if std::env::var_os("NEXTEST").is_some() {
            assert!(configured, "the first SQLite call of a fresh process configures it");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.sqlite3");
        let (store, _) = Store::open(&path).unwrap();
        store.save_durably(record("sess-a")).await.unwrap();
        let (mut current, mut highest) = (0i64, 0i64);
        // SAFETY: reads two counters into our own variables.
        let code = unsafe {
            rusqlite::ffi::sqlite3_status64(rusqlite::ffi::SQLITE_STATUS_MEMORY_USED, &mut current, &mut highest, 0)
        };
        assert_eq!(code, rusqlite::ffi::SQLITE_OK);
        if configured {
            assert_eq!((current, highest), (0, 0), "memory statistics are off");
        } else {
            assert!(current > 0, "SQLite started first, so it still counts its memory");
        }
    }

    /// A database from before tool tokens were hashed: its plain tokens
    /// become digests, and no byte of them is left in the file or its WAL.
    #[tokio::test]
    async fn plain_tool_tokens_of_an_older_database_become_digests_and_leave_no_trace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.sqlite3");
        let plain = "ab".repeat(32);
        {
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "journal_mode", "WAL").unwrap();
            conn.execute_batch(SCHEMA).unwrap();
            conn.execute(
                "INSERT INTO sessions(id, origin, provider, model, effort_level, created_at_ms, workspace,
                    managed_workspace, auto_end_on_disconnect, status, prepared, seq_ceiling, tool_token)
                 VALUES ('sess-old', 'app:x', 'scripted', '', 0, 1, '/w', 1, 0, 'idle', 0, 0, ?1)",
                [&plain],
            )
            .unwrap();
        }
        let contains = |needle: &str| {
            std::fs::read_dir(dir.path()).unwrap().flatten().any(|f| {
                std::fs::read(f.path()).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
            })
        };
        assert!(contains(&plain), "the old database holds the plain token");
        let (store, records) = Store::open(&path).unwrap();
        assert_eq!(records[0].tool_token_digest, ToolTokenDigest::of(&plain));
        store.flush().await.unwrap();
        assert!(!contains(&plain), "no file in the directory holds it after the upgrade");
        let stored = read_record(&path, "sess-old").unwrap().unwrap();
        assert_eq!(stored.tool_token_digest, ToolTokenDigest::of(&plain));
    }

    #[tokio::test]
    async fn skills_are_kept_once_and_later_writes_keep_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.sqlite3");
        let (store, _) = Store::open(&path).unwrap();
        store.save_durably(record("sess-a")).await.unwrap();
        assert_eq!(read_record(&path, "sess-a").unwrap().unwrap().skills_json, None, "a row without a copy");
        store.adopt_skills(&"sess-a".into(), "{\"guidance\":\"first\"}".into());
        store.adopt_skills(&"sess-a".into(), "{\"guidance\":\"second\"}".into());
        store.save_durably(record("sess-a")).await.unwrap();
        let kept = read_record(&path, "sess-a").unwrap().unwrap().skills_json;
        assert_eq!(kept.as_deref(), Some("{\"guidance\":\"first\"}"), "adopted once, kept by later writes");
    }

    #[tokio::test]
    async fn injected_faults_fail_exactly_the_armed_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.sqlite3");
        let (store, _) = Store::open(&path).unwrap();
        store.fail_next_jobs(1);
        let error = store.save_durably(record("sess-a")).await.unwrap_err();
        assert_eq!(error.code(), pedelec_protocol::ErrorCode::Internal);
        assert!(read_record(&path, "sess-a").unwrap().is_none(), "the failed job wrote nothing");
        store.save_durably(record("sess-a")).await.expect("the next job commits");
        assert!(read_record(&path, "sess-a").unwrap().is_some());
    }

    #[tokio::test]
    async fn synchronous_is_full_for_waited_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.sqlite3");
        let (store, _) = Store::open(&path).unwrap();
        let mode = std::sync::Arc::new(std::sync::Mutex::new(-1));
        let seen = mode.clone();
        store
            .submit_and_wait(Box::new(move |c| {
                *seen.lock().unwrap() = c.pragma_query_value(None, "synchronous", |row| row.get::<_, i64>(0))?;
                Ok(())
            }))
            .await
            .unwrap();
        assert_eq!(*mode.lock().unwrap(), 2, "synchronous=FULL (2) while a waited batch commits");
    }
}
