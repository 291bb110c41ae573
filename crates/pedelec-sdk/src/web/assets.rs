//! Asset bytes in the browser: the tickets come from the shared session code,
//! the bytes go over Core's 127.0.0.1 transfer server with `fetch` (CORS is
//! granted to the session's origin only), never through the extension.

use js_sys::{Array, Uint8Array};
use pedelec_protocol::{ErrorCode, limits, pb};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{File, FilePropertyBag, Headers, RequestInit, Response};

use super::js;
use crate::error::PedelecError;

#[wasm_bindgen::prelude::wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_name = fetch)]
    fn fetch_with_init(url: &str, init: &RequestInit) -> js_sys::Promise;
}

fn failed(code: ErrorCode, message: impl Into<String>) -> PedelecError {
    PedelecError::new(code, message)
}

fn check_loopback(ticket: &pb::AssetTicket, code: ErrorCode) -> Result<(), PedelecError> {
    if !ticket.url.starts_with("http://127.0.0.1:") {
        return Err(failed(code, format!("refusing a non-loopback transfer URL {}", ticket.url)));
    }
    Ok(())
}

async fn send(url: &str, init: &RequestInit, code: ErrorCode) -> Result<Response, PedelecError> {
    let response =
        JsFuture::from(fetch_with_init(url, init)).await.map_err(|e| failed(code, js::thrown_message(&e)))?;
    let response: Response = response.unchecked_into();
    if response.ok() {
        return Ok(response);
    }
    // The transfer server answers failures with a JSON `pb::Error`.
    let status = response.status();
    let text = match response.text() {
        Ok(p) => JsFuture::from(p).await.ok().and_then(|t| t.as_string()).unwrap_or_default(),
        Err(_) => String::new(),
    };
    Err(match serde_json::from_str::<pb::Error>(&text) {
        Ok(error) if !error.code.is_empty() => error.into(),
        _ => failed(code, format!("transfer failed with HTTP {status}")),
    })
}

fn headers(ticket: &pb::AssetTicket, content_type: Option<&str>) -> Result<Headers, PedelecError> {
    let internal = |e: JsValue| failed(ErrorCode::Internal, js::thrown_message(&e));
    let headers = Headers::new().map_err(internal)?;
    headers.set("Authorization", &format!("Bearer {}", ticket.token)).map_err(internal)?;
    if let Some(content_type) = content_type.filter(|c| !c.is_empty()) {
        headers.set("Content-Type", content_type).map_err(internal)?;
    }
    Ok(headers)
}

/// PUTs a browser `File` to an upload ticket.
pub async fn put(ticket: &pb::AssetTicket, file: &File) -> Result<(), PedelecError> {
    let code = ErrorCode::AssetUploadFailed;
    check_loopback(ticket, code)?;
    let init = RequestInit::new();
    init.set_method("PUT");
    init.set_headers(&headers(ticket, Some(&file.type_()))?.into());
    init.set_body(file);
    send(&ticket.url, &init, code).await.map(|_| ())
}

/// GETs a download ticket's bytes, bounded by the 100 MiB read limit.
pub async fn get(ticket: &pb::AssetTicket) -> Result<Vec<u8>, PedelecError> {
    let code = ErrorCode::AssetDownloadFailed;
    check_loopback(ticket, code)?;
    let init = RequestInit::new();
    init.set_method("GET");
    init.set_headers(&headers(ticket, None)?.into());
    let response = send(&ticket.url, &init, code).await?;
    let buffer = response.array_buffer().map_err(|e| failed(code, js::thrown_message(&e)))?;
    let buffer = JsFuture::from(buffer).await.map_err(|e| failed(code, js::thrown_message(&e)))?;
    let bytes = Uint8Array::new(&buffer);
    if u64::from(bytes.length()) > limits::MAX_ASSET_BYTES {
        return Err(PedelecError::new(ErrorCode::AssetTooLarge, "the asset exceeds the 100 MiB read limit"));
    }
    Ok(bytes.to_vec())
}

/// A browser `File` with the asset's name, MIME type and modification time.
pub fn to_file(asset: &pb::Asset, bytes: &[u8]) -> Result<File, PedelecError> {
    let parts = Array::of1(&Uint8Array::from(bytes).into());
    let options = FilePropertyBag::new();
    options.set_type(&asset.mime_type);
    options.set_last_modified(asset.modified_at_ms as f64);
    File::new_with_u8_array_sequence_and_options(&parts, &asset.name, &options)
        .map_err(|e| failed(ErrorCode::AssetDownloadFailed, js::thrown_message(&e)))
}
