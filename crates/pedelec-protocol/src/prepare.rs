//! The preparation handshake: the prompt Core sends and the rule for the answer.
//!
//! A preparation proves that the agent runs and follows an instruction:
//! Core sends [`PREPARE_PROMPT`] and the agent's text must acknowledge it
//! with [`PREPARED_ACK`]. That text never reaches chat events.
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::prepare::{PREPARE_PROMPT, PREPARED_ACK, acknowledged};
//!
//! // The prompt asks for exactly the token the rule accepts.
//! assert!(PREPARE_PROMPT.contains(PREPARED_ACK));
//! assert!(acknowledged(PREPARED_ACK));
//! ```

/// The preparation prompt Core sends; the agent must answer with [`PREPARED_ACK`].
///
/// # Examples
///
/// ```
/// use pedelec_protocol::prepare::PREPARE_PROMPT;
///
/// assert!(PREPARE_PROMPT.starts_with("Pedelec is preparing this session."));
/// ```
pub const PREPARE_PROMPT: &str =
    "Pedelec is preparing this session. Reply with exactly PEDELEC_PREPARED and nothing else.";

/// The acknowledgement a preparation must produce.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::prepare::{PREPARED_ACK, acknowledged};
///
/// assert_eq!(PREPARED_ACK, "PEDELEC_PREPARED");
/// assert!(acknowledged(&format!("{PREPARED_ACK}\n")));
/// ```
pub const PREPARED_ACK: &str = "PEDELEC_PREPARED";

/// Longest answer that can still count as an acknowledgement: a notice an
/// agent prepends is a sentence or two, not an essay.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::prepare::{MAX_ANSWER_CHARS, acknowledged};
///
/// let essay = format!("{}. PEDELEC_PREPARED", "word ".repeat(MAX_ANSWER_CHARS / 5));
/// assert!(!acknowledged(&essay));
/// ```
pub const MAX_ANSWER_CHARS: usize = 1024;

/// Whether a preparation's text acknowledges it.
///
/// The answer is acknowledged when, trimmed, it is exactly [`PREPARED_ACK`],
/// or when [`PREPARED_ACK`] is its last sentence: some agents put notices of
/// their own in front of the model's text in the same message, with no
/// separator we could split on (codex-acp 0.16 prepends "Model metadata for
/// `…` not found. …" for a model codex has no metadata for). The text before
/// the acknowledgement must then end a sentence (`.`, `!`, `?`, `:`, a
/// newline or a space) and the whole answer must be at most
/// [`MAX_ANSWER_CHARS`]; anything else — an empty answer, a refusal, the
/// token inside a word — is not an acknowledgement.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::prepare::acknowledged;
/// assert!(acknowledged(" PEDELEC_PREPARED\n"));
/// assert!(acknowledged("Model metadata for `m` not found. Defaulting to fallback metadata.PEDELEC_PREPARED"));
/// assert!(!acknowledged("Not ready yet."));
/// assert!(!acknowledged("XPEDELEC_PREPARED"));
/// ```
pub fn acknowledged(answer: &str) -> bool {
    let answer = answer.trim();
    if answer == PREPARED_ACK {
        return true;
    }
    if answer.chars().count() > MAX_ANSWER_CHARS {
        return false;
    }
    let Some(before) = answer.strip_suffix(PREPARED_ACK) else { return false };
    before.ends_with(|c: char| matches!(c, '.' | '!' | '?' | ':') || c.is_whitespace())
}

/// What a `prepare()` request comes to, before the status is checked.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::prepare::{PrepareStart, start};
///
/// // A second `prepare()` while the first runs shares it.
/// assert_eq!(start(false, true), PrepareStart::Join);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepareStart {
    /// A preparation is under way: the request shares it (the seed's
    /// "concurrent prepare calls share one promise").
    Join,
    /// The session is prepared: the request succeeds at once ("idempotent after success").
    AlreadyDone,
    /// A new preparation may start (if the status allows one).
    Start,
}

/// The preparation rule Core and the SDK both follow: a preparation under
/// way is joined, a prepared session is done, anything else starts one.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::prepare::{PrepareStart, start};
/// assert_eq!(start(false, true), PrepareStart::Join);
/// assert_eq!(start(true, false), PrepareStart::AlreadyDone);
/// assert_eq!(start(false, false), PrepareStart::Start);
/// ```
pub fn start(prepared: bool, preparing: bool) -> PrepareStart {
    match (preparing, prepared) {
        (true, _) => PrepareStart::Join,
        (false, true) => PrepareStart::AlreadyDone,
        (false, false) => PrepareStart::Start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preparation_under_way_is_joined_even_once_it_succeeded() {
        // Core marks the session prepared while the completion is committed,
        // and the operation is still the active one then.
        assert_eq!(start(true, true), PrepareStart::Join);
    }

    #[test]
    fn exact_answers_are_acknowledgements() {
        for answer in ["PEDELEC_PREPARED", "  PEDELEC_PREPARED \n", "\nPEDELEC_PREPARED"] {
            assert!(acknowledged(answer), "{answer:?}");
        }
    }

    #[test]
    fn a_notice_in_front_counts_only_as_a_sentence_of_its_own() {
        assert!(acknowledged("Warning: something.\n\nPEDELEC_PREPARED"));
        assert!(acknowledged("Notice: PEDELEC_PREPARED"));
        assert!(!acknowledged("I will not say PEDELEC_PREPAREDX"));
        assert!(!acknowledged("NOT_PEDELEC_PREPARED"));
        assert!(!acknowledged("PEDELEC_PREPARED is what you want, but no."));
    }

    #[test]
    fn empty_and_long_answers_are_not() {
        assert!(!acknowledged(""));
        assert!(!acknowledged("   "));
        let essay = format!("{}. PEDELEC_PREPARED", "word ".repeat(300));
        assert!(!acknowledged(&essay));
    }
}
