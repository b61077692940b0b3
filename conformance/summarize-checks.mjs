// Reads one scenario's checks.json (written by `conformance server --output-dir`) and prints
//   <successes> <failures> <warnings>
// on the first line, then one line per FAILURE or WARNING check: "  FAILURE Name: message".
// A missing or unreadable file prints "0 0 0" and a line saying so (the caller counts it failed).
import { readFileSync } from "node:fs";

const [path] = process.argv.slice(2);
let checks;
try {
  checks = JSON.parse(readFileSync(path, "utf8"));
  if (!Array.isArray(checks)) throw new Error("not an array of checks");
} catch (error) {
  console.log("0 0 0");
  console.log(`  ERROR   no usable checks.json (${error.message})`);
  process.exit(0);
}
const count = (status) => checks.filter((check) => check.status === status).length;
console.log(`${count("SUCCESS")} ${count("FAILURE")} ${count("WARNING")}`);
for (const check of checks) {
  if (check.status !== "FAILURE" && check.status !== "WARNING") continue;
  const message = (check.errorMessage ?? check.description ?? "").replace(/\s+/g, " ").slice(0, 400);
  console.log(`  ${check.status.padEnd(7)} ${check.name}: ${message}`);
}
