// Usage: node scripts/check-npm-optional.mjs DIR
//
// Fails, naming them, when npm ci left out optional packages of DIR's
// package-lock.json that this machine's platform takes: npm skips an
// optional package it cannot fetch (a registry it cannot reach, or whose
// certificate authority it does not trust) and still reports success.
// Packages for another os, cpu or libc, and what they depend on, are not
// needed here.
import fs from "node:fs";
import path from "node:path";

const dir = process.argv[2] ?? ".";
const lock = JSON.parse(fs.readFileSync(path.join(dir, "package-lock.json"), "utf8"));
const libc = process.platform === "linux" ? (process.report.getReport().header.glibcVersionRuntime ? "glibc" : "musl") : undefined;

// fits reports whether value passes an os, cpu or libc list of npm's: the
// names allowed, or "!name" for those refused.
function fits(list, value) {
  if (!list || value === undefined) return true;
  if (list.includes("!" + value)) return false;
  return list.every((e) => e.startsWith("!")) || list.includes(value);
}

const skipped = [];
const missing = [];
for (const [where, pkg] of Object.entries(lock.packages ?? {})) {
  if (!where || !pkg.optional || skipped.some((s) => where.startsWith(s + "/node_modules/"))) continue;
  if (!fits(pkg.os, process.platform) || !fits(pkg.cpu, process.arch) || !fits(pkg.libc, libc)) {
    skipped.push(where);
    continue;
  }
  if (!fs.existsSync(path.join(dir, where))) missing.push(where.replace(/^.*node_modules\//, ""));
}
if (missing.length > 0) {
  console.error(
    `npm ci in ${dir} left out ${missing.length} optional package(s) this machine needs: ${missing.join(", ")}. ` +
      "npm skips those it cannot fetch: check that the npm registry can be reached and its certificate authority is trusted " +
      "(NODE_EXTRA_CA_CERTS), then run make again.",
  );
  process.exit(1);
}
