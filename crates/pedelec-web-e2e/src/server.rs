//! A tiny static file server on 127.0.0.1 for the demo page and the wasm
//! package (wasm must be served as `application/wasm` for streaming
//! instantiation). One thread per connection; GET only.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};

pub struct StaticServer {
    pub port: u16,
}

impl StaticServer {
    /// Serves `root` on an ephemeral port until the process exits.
    pub fn start(root: &Path) -> std::io::Result<StaticServer> {
        Self::start_with(root, "")
    }

    /// Like [`start`](Self::start), with the headers that make its pages
    /// cross-origin isolated: `performance.now()` then ticks in 5 µs instead
    /// of 100 µs, which the benchmark's in-page timings need.
    pub fn start_isolated(root: &Path) -> std::io::Result<StaticServer> {
        Self::start_with(
            root,
            "Cross-Origin-Opener-Policy: same-origin\r\nCross-Origin-Embedder-Policy: require-corp\r\n",
        )
    }

    fn start_with(root: &Path, headers: &'static str) -> std::io::Result<StaticServer> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let root = root.to_path_buf();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let root = root.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, &root, headers);
                });
            }
        });
        Ok(StaticServer { port })
    }

    /// `http://127.0.0.1:<port>` — the page origin.
    pub fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

fn mime(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("json") => "application/json",
        Some("ts") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// The file for a request path, refusing anything that leaves `root`.
fn resolve(root: &Path, target: &str) -> Option<PathBuf> {
    let path = target.split(['?', '#']).next().unwrap_or("/");
    let relative = Path::new(path.trim_start_matches('/'));
    if relative.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    let full = root.join(relative);
    Some(if full.is_dir() { full.join("index.html") } else { full })
}

fn serve(stream: TcpStream, root: &Path, headers: &str) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut stream = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut line = String::new();
        while reader.read_line(&mut line)? > 2 {
            line.clear();
        }
        let mut parts = request_line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
        let file = resolve(root, target).filter(|_| method == "GET");
        match file.and_then(|f| std::fs::read(&f).ok().map(|b| (f, b))) {
            Some((file, body)) => {
                write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n{headers}\r\n",
                    mime(&file),
                    body.len()
                )?;
                stream.write_all(&body)?;
            }
            None => stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")?,
        }
        stream.flush()?;
    }
}
