// Command ledgermcp is the MCP gateway: it serves the tools of the MCP
// servers its configuration names, and runs every call through the
// operation ledger, so that an agent's retries never apply an effect twice.
//
//	ledgermcp --config gateway.yaml              # MCP over stdin and stdout
//	ledgermcp --config gateway.yaml --http ADDR  # MCP over Streamable HTTP
//	ledgermcp ... --metrics-listen ADDR           # and Prometheus /metrics
//
// Over Streamable HTTP it also answers health probes at /healthz. It logs
// to stderr. On SIGTERM, SIGINT or SIGHUP it lets the calls in flight
// end, then exits; a second signal ends it at once. docs/mcp.md describes
// the configuration and what the gateway promises. Exit status: 0 when the
// session or the server ended, 1 when it could not start (a key of its own
// the ledger refuses, say) or failed, 2 on bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/net/netutil"

	"github.com/opledger/ledger/internal/gogc"
	"github.com/opledger/ledger/mcpgateway"
)

func main() {
	gogc.Tune(os.Getenv)
	// SIGHUP too (its terminal closed, or an operator's reload, which the
	// gateway does not have): its default would end the process at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	// The first signal lets the calls in flight end; a second ends the
	// process at once.
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: ledgermcp --config FILE [--http HOST:PORT] [--ledger HOST:PORT] [--metrics-listen HOST:PORT] [--metrics-tenant-label] [--log-level LEVEL]

Serve the tools of the MCP servers FILE names, over stdio (or Streamable
HTTP with --http), running every call through the operation ledger.
docs/mcp.md describes FILE.

`

// run runs the gateway and returns its exit status.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("ledgermcp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", os.Getenv("LEDGERMCP_CONFIG"), "the configuration file (env LEDGERMCP_CONFIG)")
	listen := fs.String("http", "", "serve Streamable HTTP on this HOST:PORT instead of stdio (the file's http.listen otherwise)")
	ledgerAddr := fs.String("ledger", "", "ledgerd's HOST:PORT (the file's ledger.address otherwise)")
	metricsListen := fs.String("metrics-listen", "", "serve Prometheus /metrics on this HOST:PORT (the file's metrics.listen otherwise)")
	tenantLabel := fs.Bool("metrics-tenant-label", false, "add the tenant of each call's key to the call metrics (as the file's metrics.tenant_label: true)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var lvl slog.Level
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "ledgermcp: unexpected arguments: %v: ledgermcp takes flags only (ledgermcp -h lists them)\n", fs.Args())
		return 2
	case *config == "":
		fmt.Fprintln(stderr, "ledgermcp: --config FILE is required")
		return 2
	case lvl.UnmarshalText([]byte(*level)) != nil:
		fmt.Fprintf(stderr, "ledgermcp: --log-level %q: want debug, info, warn or error\n", *level)
		return 2
	}
	cfg, err := mcpgateway.LoadConfig(*config)
	if err == nil && (*listen != "" || *ledgerAddr != "" || *metricsListen != "") {
		err = mcpgateway.Override(cfg, *ledgerAddr, *listen, *metricsListen)
	}
	if err != nil {
		fmt.Fprintln(stderr, "ledgermcp:", err)
		return 2
	}
	if *tenantLabel {
		cfg.Metrics.TenantLabel = true
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("ledgermcp stopped", "error", err)
		return 1
	}
	return 0
}

// idleTimeout is how long the listeners keep a connection with no request
// open.
var idleTimeout = 2 * time.Minute

// serve runs the gateway until its session ends (stdio) or ctx does.
func serve(ctx context.Context, cfg *mcpgateway.Config, log *slog.Logger) error {
	g, err := mcpgateway.New(cfg, log)
	if err != nil {
		return err
	}
	defer g.Close()
	if err := g.CheckKeys(ctx); err != nil {
		return err
	}
	if cfg.Metrics.Listen != "" {
		stop, err := serveMetrics(cfg.Metrics.Listen, g.MetricsHandler(), log)
		if err != nil {
			return err
		}
		defer stop()
	}
	g.Start(ctx, 15*time.Second)
	if cfg.HTTP.Listen == "" {
		log.Info("serving MCP over stdio", "ledger", cfg.Ledger.Address)
		return g.Serve(ctx, &mcp.StdioTransport{})
	}
	lis, err := net.Listen("tcp", cfg.HTTP.Listen)
	if err != nil {
		return err
	}
	if n := *cfg.HTTP.MaxConnections; n > 0 {
		lis = netutil.LimitListener(lis, n)
	}
	srv := &http.Server{Handler: g.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idleTimeout,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("ledgermcp serving", "listen", lis.Addr().String(), "path", cfg.HTTP.Path, "ledger", cfg.Ledger.Address)
	if t := cfg.HTTP.TLS; t != nil {
		err = srv.ServeTLS(lis, t.CertFile, t.KeyFile)
	} else {
		err = srv.Serve(lis)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// serveMetrics serves h at /metrics on addr until stop is called.
func serveMetrics(addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics.listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idleTimeout,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() { _ = srv.Serve(lis) }()
	log.Info("metrics serving", "listen", lis.Addr().String())
	return func() { _ = srv.Close() }, nil
}
