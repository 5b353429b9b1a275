// Package langhost holds what nvlfabric's own Pulumi language hosts (Python and Node.js) share:
// serving the LanguageRuntime service the way the engine expects, the engine handshake, the
// stack's config as the SDKs read it, and how a program's exit becomes a RunResponse.
package langhost

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"

	"google.golang.org/grpc"
	pbempty "google.golang.org/protobuf/types/known/emptypb"

	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
)

// BailExitCode is what both SDKs' run scripts exit with after they have printed a
// user-actionable error; the engine must not print a second, generic one.
const BailExitCode = 32

// Serve parses the flags the engine passes a language host, builds the host with newHost
// (engine address, --root), serves it, and prints the port on stdout, where the engine reads it.
// It returns only when the server stops.
func Serve(name string, newHost func(engineAddress, root string) pulumirpc.LanguageRuntimeServer) {
	flags := flag.NewFlagSet(name, flag.ContinueOnError)
	// The engine may pass these; we accept and ignore the ones we have no use for.
	_ = flags.String("tracing", "", "Zipkin-compatible tracing endpoint (ignored)")
	_ = flags.Int("v", 0, "log verbosity (ignored)")
	_ = flags.Bool("logtostderr", false, "log to stderr (ignored)")
	_ = flags.Bool("logflow", false, "flow logging settings to child processes (ignored)")
	_ = flags.Bool("typescript", true, "obsolete (Node.js): runtime.options.typescript in Pulumi.yaml decides")
	root := flags.String("root", "", "project root directory (fallback when Handshake is not used)")
	if err := flags.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if flags.NArg() < 1 {
		fmt.Fprintf(os.Stderr, "usage: %s [flags] ENGINE_ADDRESS\n", name)
		os.Exit(2)
	}
	host := newHost(flags.Arg(0), *root)
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Cancel: make(chan bool),
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, host)
			return nil
		},
		Options: rpcutil.OpenTracingServerInterceptorOptions(nil),
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: could not start gRPC server: %v\n", name, err)
		os.Exit(1)
	}
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		fmt.Fprintf(os.Stderr, "%s: gRPC server stopped: %v\n", name, err)
		os.Exit(1)
	}
}

// Base answers the calls every host answers alike; hosts embed it.
type Base struct {
	pulumirpc.UnimplementedLanguageRuntimeServer

	Version string

	mu            sync.Mutex
	engineAddress string
	rootDir       string
}

// NewBase is a Base for a host of `version` started for the engine at engineAddress.
func NewBase(version, engineAddress, root string) *Base {
	return &Base{Version: version, engineAddress: engineAddress, rootDir: root}
}

func (b *Base) Handshake(
	_ context.Context, req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.engineAddress = req.GetEngineAddress()
	if req.RootDirectory != nil {
		b.rootDir = req.GetRootDirectory()
	}
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

// EngineAddress is the engine's address, from the command line or the handshake.
func (b *Base) EngineAddress() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.engineAddress
}

func (b *Base) GetPluginInfo(context.Context, *pbempty.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: b.Version}, nil
}

func (b *Base) RuntimeOptionsPrompts(
	context.Context, *pulumirpc.RuntimeOptionsRequest,
) (*pulumirpc.RuntimeOptionsResponse, error) {
	return &pulumirpc.RuntimeOptionsResponse{}, nil
}

// ConfigEnv is the stack's config as both SDKs read it: PULUMI_CONFIG and
// PULUMI_CONFIG_SECRET_KEYS, JSON. A stack without config sends nil, which is encoded as {} and
// [] (the SDKs read "null" as no mapping and fail).
func ConfigEnv(req *pulumirpc.RunRequest) ([]string, error) {
	configMap := req.GetConfig()
	if configMap == nil {
		configMap = map[string]string{}
	}
	secretList := req.GetConfigSecretKeys()
	if secretList == nil {
		secretList = []string{}
	}
	config, err := json.Marshal(configMap)
	if err != nil {
		return nil, fmt.Errorf("encoding stack config: %w", err)
	}
	secretKeys, err := json.Marshal(secretList)
	if err != nil {
		return nil, fmt.Errorf("encoding secret config keys: %w", err)
	}
	return []string{"PULUMI_CONFIG=" + string(config), "PULUMI_CONFIG_SECRET_KEYS=" + string(secretKeys)}, nil
}

// RunResult is the RunResponse for how the program run by `exe` ended.
func RunResult(err error, exe string) *pulumirpc.RunResponse {
	if err == nil {
		return &pulumirpc.RunResponse{}
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if exitErr.ExitCode() == BailExitCode {
			return &pulumirpc.RunResponse{Bail: true}
		}
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("Program exited with non-zero exit code: %d",
			exitErr.ExitCode())}
	}
	return &pulumirpc.RunResponse{Error: fmt.Sprintf("Problem executing program (could not run %s): %v", exe, err)}
}

// Package is the dependency on a resource plugin that an installed SDK package declares
// (version with or without its leading "v").
func Package(name, version, server string) *pulumirpc.PackageDependency {
	if version != "" && !strings.HasPrefix(version, "v") {
		version = "v" + version
	}
	return &pulumirpc.PackageDependency{Name: name, Kind: "resource", Version: version, Server: server}
}

// Plugins is GetRequiredPlugins' answer (the older call) for GetRequiredPackages' packages.
func Plugins(deps []*pulumirpc.PackageDependency) *pulumirpc.GetRequiredPluginsResponse {
	plugins := make([]*pulumirpc.PluginDependency, 0, len(deps))
	for _, d := range deps {
		plugins = append(plugins, &pulumirpc.PluginDependency{
			Name: d.GetName(), Kind: d.GetKind(), Version: d.GetVersion(), Server: d.GetServer(),
		})
	}
	return &pulumirpc.GetRequiredPluginsResponse{Plugins: plugins}
}
