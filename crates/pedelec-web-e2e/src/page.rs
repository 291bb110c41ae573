//! One browser tab driven over CDP: evaluate JavaScript, wait, click, screenshot.

use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use crate::E2eError;
use crate::cdp::{Browser, PendingReply};

pub struct Page<'b> {
    browser: &'b Browser,
    pub target_id: String,
    pub session: String,
}

fn evaluated(reply: Value, expression: &str) -> Result<Value, E2eError> {
    if let Some(details) = reply.get("exceptionDetails") {
        let text = details["exception"]["description"].as_str().or(details["text"].as_str()).unwrap_or("exception");
        return Err(E2eError::Script { expression: expression.chars().take(120).collect(), message: text.to_owned() });
    }
    Ok(reply["result"]["value"].clone())
}

impl<'b> Page<'b> {
    /// Opens a new tab on `url` and attaches to it.
    pub fn open(browser: &'b Browser, url: &str) -> Result<Self, E2eError> {
        let reply = browser.call("Target.createTarget", json!({ "url": url }), None)?;
        let target_id = reply["targetId"].as_str().unwrap_or_default().to_owned();
        Self::attach(browser, &target_id)
    }

    /// Attaches to an existing target.
    pub fn attach(browser: &'b Browser, target_id: &str) -> Result<Self, E2eError> {
        let session = browser.attach(target_id)?;
        browser.call("Runtime.enable", json!({}), Some(&session))?;
        Ok(Page { browser, target_id: target_id.to_owned(), session })
    }

    /// Starts evaluating `expression` (promises awaited, result by value).
    pub fn eval_later(&self, expression: &str) -> Result<PendingReply, E2eError> {
        let params = json!({ "expression": expression, "awaitPromise": true, "returnByValue": true });
        self.browser.send("Runtime.evaluate", params, Some(&self.session))
    }

    pub fn eval_for(&self, expression: &str, timeout: Duration) -> Result<Value, E2eError> {
        evaluated(self.eval_later(expression)?.wait(timeout)?, expression)
    }

    pub fn eval(&self, expression: &str) -> Result<Value, E2eError> {
        self.eval_for(expression, Duration::from_secs(30))
    }

    /// Waits until `expression` is truthy.
    pub fn wait_until(&self, expression: &str, timeout: Duration) -> Result<(), E2eError> {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.eval(&format!("!!({expression})")).unwrap_or(Value::Bool(false));
            if value == Value::Bool(true) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(E2eError::Timeout(format!("waiting for `{expression}`")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Makes this the visible tab (the others are then hidden: a page that
    /// pauses while hidden, as the control center does, runs again).
    pub fn bring_to_front(&self) -> Result<(), E2eError> {
        self.browser.call("Page.bringToFront", json!({}), Some(&self.session))?;
        Ok(())
    }

    /// Clicks the centre of the element as a user would (trusted mouse events).
    pub fn click(&self, selector: &str) -> Result<(), E2eError> {
        let sel = serde_json::to_string(selector)?;
        // Input goes to the visible tab only; a background tab never acknowledges it.
        self.browser.call("Page.bringToFront", json!({}), Some(&self.session))?;
        self.wait_until(&format!("document.querySelector({sel})"), Duration::from_secs(10))?;
        let rect = self.eval(&format!(
            "(() => {{ const e = document.querySelector({sel}); e.scrollIntoView(); const r = e.getBoundingClientRect(); \
             return {{ x: r.x + r.width / 2, y: r.y + r.height / 2 }}; }})()"
        ))?;
        let event =
            |kind: &str| json!({ "type": kind, "x": rect["x"], "y": rect["y"], "button": "left", "clickCount": 1 });
        self.browser.call("Input.dispatchMouseEvent", event("mousePressed"), Some(&self.session))?;
        // The click may close this very tab (the approval page does), and a closed
        // tab never acknowledges the release, so its reply is not required.
        let release = self.browser.send("Input.dispatchMouseEvent", event("mouseReleased"), Some(&self.session))?;
        let _ = release.wait(Duration::from_secs(2));
        Ok(())
    }

    /// Saves a PNG of the tab.
    pub fn screenshot(&self, path: &Path) -> Result<(), E2eError> {
        let reply = self.browser.call("Page.captureScreenshot", json!({ "format": "png" }), Some(&self.session))?;
        let data = reply["data"].as_str().ok_or_else(|| E2eError::Protocol("screenshot without data".into()))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| E2eError::Protocol(format!("screenshot is not base64: {e}")))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, bytes)?;
        Ok(())
    }

    /// Stops driving the target and leaves it running (a DevTools session
    /// keeps a service worker from being stopped as usual).
    pub fn detach(self) -> Result<(), E2eError> {
        self.browser.call("Target.detachFromTarget", json!({ "sessionId": self.session }), None)?;
        Ok(())
    }

    /// Closes the tab (its extension port, native host and subscriptions go with it).
    pub fn close(self) -> Result<(), E2eError> {
        self.browser.call("Target.closeTarget", json!({ "targetId": self.target_id }), None)?;
        Ok(())
    }
}
