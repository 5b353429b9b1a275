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

	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"nvlfabric.io/tools/pulumi/langhost"
)

// version is stamped by tools/build.py with -ldflags "-X main.version=...".
var version = "0.0.0-dev"

func main() {
	langhost.Serve("pulumi-language-python", func(engineAddress, root string) pulumirpc.LanguageRuntimeServer {
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintf(os.Stderr, "pulumi-language-python: cannot find own path: %v\n", err)
			os.Exit(1)
		}
		return &languageHost{
			Base:       langhost.NewBase(version, engineAddress, root),
			execScript: filepath.Join(filepath.Dir(self), "pulumi-language-python-exec"),
		}
	})
}

type languageHost struct {
	*langhost.Base

	execScript string
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
		deps = append(deps, langhost.Package(p.Name, p.Version, p.Server))
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
	return langhost.Plugins(deps), nil
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
	args := []string{"-u", h.execScript,
		"--project", req.GetProject(),
		"--stack", req.GetStack(),
		"--parallel", fmt.Sprint(req.GetParallel()),
		"--dry_run", fmt.Sprint(req.GetDryRun()),
		"--monitor", req.GetMonitorAddress(),
		"--engine", h.EngineAddress(),
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

	config, err := langhost.ConfigEnv(req)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Dir = req.GetPwd()
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), config...)
	return langhost.RunResult(cmd.Run(), python), nil
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

var _ io.Writer = streamWriter{}
