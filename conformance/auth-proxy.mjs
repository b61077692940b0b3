// A loopback-only HTTP relay that adds `Authorization: Bearer <token>` to every request it
// forwards to the Engram Memory server, and changes nothing else.
//
// Why it exists: @modelcontextprotocol/conformance 0.1.12 has no way to send a header (no CLI
// option, no environment variable; its client transport is built from the URL alone), while
// every request to Engram Memory must carry a bearer token. Rather than weaken the server (a
// "no auth" switch would also test a configuration nobody deploys), the harness relays the
// suite's traffic to the real, authenticated server:
//
//   * the request line, body and every header the suite sent go upstream verbatim — `Host` and
//     `Origin` included, so the suite's DNS-rebinding probes reach the server's own checks;
//   * the token is added only when the request carries no `Authorization` of its own;
//   * the response (status, headers, body) comes back as it arrives, chunk by chunk, so SSE
//     streams are neither buffered nor closed early; hop-by-hop headers are left to Node.
//
// Usage (the token comes from the environment, never from argv, so `ps` does not show it):
//   ENGRAM_CONFORMANCE_TOKEN=... node auth-proxy.mjs --upstream http://127.0.0.1:PORT [--port-file F]
// It listens on 127.0.0.1 on a free port and writes that port to --port-file (and stdout).
import http from "node:http";
import { writeFileSync } from "node:fs";

function argument(name) {
  const index = process.argv.indexOf(name);
  return index > 0 ? process.argv[index + 1] : undefined;
}

const upstream = new URL(argument("--upstream") ?? "");
const portFile = argument("--port-file");
const token = process.env.ENGRAM_CONFORMANCE_TOKEN;
if (!token) {
  console.error("auth-proxy: ENGRAM_CONFORMANCE_TOKEN is not set");
  process.exit(2);
}
if (upstream.protocol !== "http:" || !["127.0.0.1", "localhost", "[::1]"].includes(upstream.hostname)) {
  console.error(`auth-proxy: --upstream must be a loopback http URL, got ${upstream.href}`);
  process.exit(2);
}

const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "upgrade",
  "te",
  "trailer",
]);

function endToEnd(headers) {
  const kept = {};
  for (const [name, value] of Object.entries(headers)) {
    if (!HOP_BY_HOP.has(name.toLowerCase())) kept[name] = value;
  }
  return kept;
}

const agent = new http.Agent({ keepAlive: true });

const server = http.createServer((request, response) => {
  const headers = endToEnd(request.headers); // `host` and `origin` stay exactly as sent
  if (!headers.authorization) headers.authorization = `Bearer ${token}`;

  const outgoing = http.request({
    agent,
    host: upstream.hostname.replace(/^\[|\]$/g, ""),
    port: upstream.port,
    method: request.method,
    path: request.url,
    headers,
  });

  outgoing.on("response", (incoming) => {
    response.writeHead(incoming.statusCode ?? 502, incoming.statusMessage, endToEnd(incoming.headers));
    response.flushHeaders(); // an SSE stream's headers go out before its first event
    incoming.pipe(response);
    incoming.on("error", () => response.destroy());
  });
  outgoing.on("error", (error) => {
    if (!response.headersSent) {
      response.writeHead(502, { "content-type": "text/plain" });
      response.end(`auth-proxy: upstream error: ${error.message}\n`);
    } else {
      response.destroy();
    }
  });
  // The suite cancels streams it is done with: pass that on, so the server sees the disconnect.
  response.on("close", () => {
    if (!response.writableFinished) outgoing.destroy();
  });
  request.pipe(outgoing);
});

server.keepAliveTimeout = 5_000;
server.listen(0, "127.0.0.1", () => {
  const { port } = server.address();
  if (portFile) writeFileSync(portFile, `${port}\n`);
  console.log(`auth-proxy: 127.0.0.1:${port} -> ${upstream.host}`);
});

for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => {
    server.close();
    agent.destroy();
    process.exit(0);
  });
}
