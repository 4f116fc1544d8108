// Package console serves the operator console: a page of plain HTML, CSS
// and JavaScript, embedded in the binary, that works through the ledger's
// HTTP/JSON API with the operator's API key (docs/console.md).
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

// Path is where the console is served.
const Path = "/console/"

//go:embed static
var static embed.FS

// policy keeps the page to its own files: no inline script, no other
// origin, no framing, no referrer.
const policy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
	"form-action 'none'; frame-ancestors 'none'; base-uri 'none'"

// Handler serves the console's files under Path.
func Handler() http.Handler {
	files, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded directory is part of the build
	}
	fileServer := http.StripPrefix(Path, http.FileServerFS(files))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", policy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-store")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		fileServer.ServeHTTP(w, r)
	})
}
