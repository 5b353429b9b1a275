// Command pulumi-language-python is nvlfabric's own Python language host for the Pulumi engine.
//
// Pulumi's official host lives in a Go module of its own that the module proxy does not serve, so
// we cannot build it offline. This host implements the LanguageRuntime gRPC service from the
// served github.com/pulumi/pulumi/sdk/v3 protos, with the behaviour the engine relies on for
// Python programs:
//
//   - Run starts `python -u pulumi-language-python-exec ...` (the script the official distribution
//     ships beside the host, copied from the sdk/v3 module at build time) with the stack's config
//     in PULUMI_CONFIG / PULUMI_CONFIG_SECRET_KEYS, and maps exit code 32 to "bail" (the program
//     already showed the user a message).
//   - GetRequiredPackages reads the pulumi-plugin.json files that provider SDKs install, so the
//     engine can resolve plugins (e.g. kubernetes 4.25.0) before the program runs.
//   - RunPlugin runs a Python plugin directory (a component provider) and streams its output.
//   - The interpreter is <root>/<virtualenv>/bin/python when Pulumi.yaml sets runtime.options
//     .virtualenv, else $PULUMI_PYTHON_CMD, else python3 on PATH.
//
// Anything else (code generation, templates, packing) answers Unimplemented, which the engine
// treats as "not supported by this language".
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pbempty "google.golang.org/protobuf/types/known/emptypb"

	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
)

// version is stamped by tools/build.py with -ldflags "-X main.version=...".
var version = "0.0.0-dev"

// bailExitCode is the exit code pulumi-language-python-exec uses after it has already printed a
// user-actionable error; the engine must not print a second, generic one.
const bailExitCode = 32

func main() {
	flags := flag.NewFlagSet("pulumi-language-python", flag.ContinueOnError)
	// The engine may pass these; we accept and ignore the ones we have no use for.
	_ = flags.String("tracing", "", "Zipkin-compatible tracing endpoint (ignored)")
	_ = flags.Int("v", 0, "log verbosity (ignored)")
	_ = flags.Bool("logtostderr", false, "log to stderr (ignored)")
	_ = flags.Bool("logflow", false, "flow logging settings to child processes (ignored)")
	root := flags.String("root", "", "project root directory (fallback when Handshake is not used)")
	if err := flags.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if flags.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: pulumi-language-python [flags] ENGINE_ADDRESS")
		os.Exit(2)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-python: cannot find own path: %v\n", err)
		os.Exit(1)
	}
	host := &languageHost{
		engineAddress: flags.Arg(0),
		execScript:    filepath.Join(filepath.Dir(self), "pulumi-language-python-exec"),
		rootDir:       *root,
	}
	cancel := make(chan bool)
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Cancel: cancel,
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, host)
			return nil
		},
		Options: rpcutil.OpenTracingServerInterceptorOptions(nil),
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-python: could not start gRPC server: %v\n", err)
		os.Exit(1)
	}
	// The engine reads the port from our first line of stdout.
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-python: gRPC server stopped: %v\n", err)
		os.Exit(1)
	}
}

type languageHost struct {
	pulumirpc.UnimplementedLanguageRuntimeServer

	mu            sync.Mutex
	engineAddress string
	execScript    string
	rootDir       string
}

func (h *languageHost) Handshake(
	_ context.Context, req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.engineAddress = req.GetEngineAddress()
	if req.RootDirectory != nil {
		h.rootDir = req.GetRootDirectory()
	}
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *languageHost) GetPluginInfo(context.Context, *pbempty.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version}, nil
}

// python picks the interpreter for a program: its virtualenv when Pulumi.yaml names one.
func (h *languageHost) python(info *pulumirpc.ProgramInfo) (string, error) {
	if info != nil && info.GetOptions() != nil {
		if venv, ok := info.GetOptions().AsMap()["virtualenv"].(string); ok && venv != "" {
			if !filepath.IsAbs(venv) {
				venv = filepath.Join(info.GetRootDirectory(), venv)
			}
			interp := filepath.Join(venv, "bin", "python")
			if _, err := os.Stat(interp); err != nil {
				return "", fmt.Errorf(
					"runtime.options.virtualenv is %q but %s does not exist; create it "+
						"(python3 -m venv %s && %s -m pip install -r requirements.txt) or run `pulumi install`",
					venv, interp, venv, interp)
			}
			return interp, nil
		}
	}
	if cmd := os.Getenv("PULUMI_PYTHON_CMD"); cmd != "" {
		return cmd, nil
	}
	return exec.LookPath("python3")
}

// requiredPluginsScript lists the pulumi-plugin.json files that installed distributions ship,
// which is how provider SDKs such as pulumi_kubernetes declare the plugin they need.
const requiredPluginsScript = `
import importlib.metadata as md, json, sys
seen, out = set(), []
for dist in md.distributions():
    for f in dist.files or ():
        if f.name != "pulumi-plugin.json" or len(f.parts) != 2:
            continue
        path = dist.locate_file(f)
        try:
            data = json.loads(open(path, encoding="utf-8").read())
        except (OSError, ValueError):
            continue
        if not data.get("resource", False):
            continue
        data.setdefault("name", f.parts[0].removeprefix("pulumi_").replace("_", "-"))
        key = (data["name"], data.get("version", ""))
        if key not in seen:
            seen.add(key)
            out.append(data)
json.dump(out, sys.stdout)
`

type pluginJSON struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Server  string `json:"server"`
}

func (h *languageHost) requiredPackages(info *pulumirpc.ProgramInfo) ([]*pulumirpc.PackageDependency, error) {
	python, err := h.python(info)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(python, "-c", requiredPluginsScript)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("listing Python packages with %s: %w: %s", python, err, stderr.String())
	}
	var plugins []pluginJSON
	if err := json.Unmarshal(out, &plugins); err != nil {
		return nil, fmt.Errorf("decoding the plugin list from %s: %w", python, err)
	}
	deps := make([]*pulumirpc.PackageDependency, 0, len(plugins))
	for _, p := range plugins {
		v := p.Version
		if v != "" && !strings.HasPrefix(v, "v") {
			v = "v" + v
		}
		deps = append(deps, &pulumirpc.PackageDependency{
			Name: p.Name, Kind: "resource", Version: v, Server: p.Server,
		})
	}
	return deps, nil
}

func (h *languageHost) GetRequiredPackages(
	_ context.Context, req *pulumirpc.GetRequiredPackagesRequest,
) (*pulumirpc.GetRequiredPackagesResponse, error) {
	deps, err := h.requiredPackages(req.GetInfo())
	if err != nil {
		return nil, err
	}
	return &pulumirpc.GetRequiredPackagesResponse{Packages: deps}, nil
}

func (h *languageHost) GetRequiredPlugins(
	_ context.Context, req *pulumirpc.GetRequiredPluginsRequest,
) (*pulumirpc.GetRequiredPluginsResponse, error) {
	deps, err := h.requiredPackages(req.GetInfo())
	if err != nil {
		return nil, err
	}
	plugins := make([]*pulumirpc.PluginDependency, 0, len(deps))
	for _, d := range deps {
		plugins = append(plugins, &pulumirpc.PluginDependency{
			Name: d.GetName(), Kind: d.GetKind(), Version: d.GetVersion(), Server: d.GetServer(),
		})
	}
	return &pulumirpc.GetRequiredPluginsResponse{Plugins: plugins}, nil
}

// programPath is what runpy runs: the entry point inside the program directory ("." means the
// directory itself, whose __main__.py runpy executes).
func programPath(info *pulumirpc.ProgramInfo, fallback string) string {
	if info == nil || info.GetProgramDirectory() == "" {
		if fallback == "" {
			return "."
		}
		return fallback
	}
	entry := info.GetEntryPoint()
	if entry == "" || entry == "." {
		return info.GetProgramDirectory()
	}
	return filepath.Join(info.GetProgramDirectory(), entry)
}

func (h *languageHost) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	python, err := h.python(req.GetInfo())
	if err != nil {
		return &pulumirpc.RunResponse{Error: err.Error()}, nil
	}
	h.mu.Lock()
	engine := h.engineAddress
	h.mu.Unlock()

	args := []string{"-u", h.execScript,
		"--project", req.GetProject(),
		"--stack", req.GetStack(),
		"--parallel", fmt.Sprint(req.GetParallel()),
		"--dry_run", fmt.Sprint(req.GetDryRun()),
		"--monitor", req.GetMonitorAddress(),
		"--engine", engine,
		"--organization", req.GetOrganization(),
	}
	if root := req.GetInfo().GetRootDirectory(); root != "" {
		args = append(args, "--root_directory", root)
	}
	if req.GetPwd() != "" {
		args = append(args, "--pwd", req.GetPwd())
	}
	args = append(args, programPath(req.GetInfo(), req.GetProgram()))
	args = append(args, req.GetArgs()...)

	// A stack without config sends nil: encode {} and [] (the SDK reads "null" as no mapping and fails).
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

	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Dir = req.GetPwd()
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"PULUMI_CONFIG="+string(config),
		"PULUMI_CONFIG_SECRET_KEYS="+string(secretKeys),
	)
	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			if exitErr.ExitCode() == bailExitCode {
				return &pulumirpc.RunResponse{Bail: true}, nil
			}
			return &pulumirpc.RunResponse{Error: fmt.Sprintf("Program exited with non-zero exit code: %d",
				exitErr.ExitCode())}, nil
		}
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("Problem executing program (could not run %s): %v",
			python, err)}, nil
	}
	return &pulumirpc.RunResponse{}, nil
}

// streamWriter forwards a child process's output to a RunPlugin stream, one chunk per write.
type streamWriter struct {
	mu     *sync.Mutex
	stream grpc.ServerStreamingServer[pulumirpc.RunPluginResponse]
	stderr bool
}

func (w streamWriter) Write(p []byte) (int, error) {
	data := append([]byte(nil), p...)
	resp := &pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Stdout{Stdout: data}}
	if w.stderr {
		resp = &pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Stderr{Stderr: data}}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.stream.Send(resp); err != nil {
		return 0, err
	}
	return len(p), nil
}

// RunPlugin runs a plugin written in Python (a PulumiPlugin.yaml directory): the engine talks to
// it over gRPC once it prints its port, which reaches the engine through this stream.
func (h *languageHost) RunPlugin(
	req *pulumirpc.RunPluginRequest, stream grpc.ServerStreamingServer[pulumirpc.RunPluginResponse],
) error {
	python, err := h.python(req.GetInfo())
	if err != nil {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	args := append([]string{"-u", programPath(req.GetInfo(), req.GetProgram())}, req.GetArgs()...)
	cmd := exec.CommandContext(stream.Context(), python, args...)
	cmd.Dir = req.GetPwd()
	cmd.Env = req.GetEnv()
	var mu sync.Mutex
	cmd.Stdout = streamWriter{mu: &mu, stream: stream}
	cmd.Stderr = streamWriter{mu: &mu, stream: stream, stderr: true}
	code := int32(0)
	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) {
			return status.Errorf(codes.Internal, "running plugin with %s: %v", python, err)
		}
		code = int32(exitErr.ExitCode())
	}
	mu.Lock()
	defer mu.Unlock()
	return stream.Send(&pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Exitcode{Exitcode: code}})
}

// InstallDependencies creates the program's virtualenv (when it names one that is missing) and
// installs requirements.txt into it, streaming pip's output.
func (h *languageHost) InstallDependencies(
	req *pulumirpc.InstallDependenciesRequest,
	stream grpc.ServerStreamingServer[pulumirpc.InstallDependenciesResponse],
) error {
	info := req.GetInfo()
	dir := req.GetDirectory()
	if info != nil && info.GetProgramDirectory() != "" {
		dir = info.GetProgramDirectory()
	}
	var venv string
	if info != nil && info.GetOptions() != nil {
		venv, _ = info.GetOptions().AsMap()["virtualenv"].(string)
	}
	send := func(out, errOut []byte) error {
		return stream.Send(&pulumirpc.InstallDependenciesResponse{Stdout: out, Stderr: errOut})
	}
	run := func(name string, args ...string) error {
		var buf bytes.Buffer
		cmd := exec.CommandContext(stream.Context(), name, args...)
		cmd.Dir = dir
		cmd.Stdout, cmd.Stderr = &buf, &buf
		err := cmd.Run()
		if sendErr := send(buf.Bytes(), nil); sendErr != nil {
			return sendErr
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
		}
		return nil
	}
	python := "python3"
	if venv != "" {
		if !filepath.IsAbs(venv) {
			venv = filepath.Join(info.GetRootDirectory(), venv)
		}
		python = filepath.Join(venv, "bin", "python")
		if _, err := os.Stat(python); err != nil {
			if err := run("python3", "-m", "venv", venv); err != nil {
				return err
			}
		}
	}
	reqs := filepath.Join(dir, "requirements.txt")
	if _, err := os.Stat(reqs); err != nil {
		return send([]byte("no requirements.txt; nothing to install\n"), nil)
	}
	return run(python, "-m", "pip", "install", "-r", reqs)
}

const dependenciesScript = `
import importlib.metadata as md, json, sys
json.dump(sorted({(d.metadata["Name"], d.version) for d in md.distributions()}), sys.stdout)
`

func (h *languageHost) GetProgramDependencies(
	_ context.Context, req *pulumirpc.GetProgramDependenciesRequest,
) (*pulumirpc.GetProgramDependenciesResponse, error) {
	python, err := h.python(req.GetInfo())
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(python, "-c", dependenciesScript).Output()
	if err != nil {
		return nil, fmt.Errorf("listing Python packages with %s: %w", python, err)
	}
	var pairs [][2]string
	if err := json.Unmarshal(out, &pairs); err != nil {
		return nil, fmt.Errorf("decoding the package list: %w", err)
	}
	resp := &pulumirpc.GetProgramDependenciesResponse{}
	for _, p := range pairs {
		resp.Dependencies = append(resp.Dependencies, &pulumirpc.DependencyInfo{Name: p[0], Version: p[1]})
	}
	return resp, nil
}

func (h *languageHost) About(_ context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	python, err := h.python(req.GetInfo())
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(python, "--version").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s --version: %w", python, err)
	}
	return &pulumirpc.AboutResponse{
		Executable: python,
		Version:    strings.TrimSpace(strings.TrimPrefix(string(out), "Python ")),
	}, nil
}

func (h *languageHost) RuntimeOptionsPrompts(
	context.Context, *pulumirpc.RuntimeOptionsRequest,
) (*pulumirpc.RuntimeOptionsResponse, error) {
	return &pulumirpc.RuntimeOptionsResponse{}, nil
}

var _ io.Writer = streamWriter{}
