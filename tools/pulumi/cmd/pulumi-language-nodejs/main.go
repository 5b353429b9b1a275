// Command pulumi-language-nodejs is nvlfabric's own Node.js (TypeScript) language host for the
// Pulumi engine, so a TypeScript project can consume nvlfabric's component provider.
//
// Pulumi's official host lives in a Go module of its own that the module proxy does not serve
// (github.com/pulumi/pulumi/sdk/nodejs/cmd/pulumi-language-nodejs/v3, refused at every version),
// so we cannot build it offline. This host implements the LanguageRuntime gRPC service from the
// served github.com/pulumi/pulumi/sdk/v3 protos, with the behaviour the engine and `pulumi package
// add` rely on:
//
//   - Run starts `node <@pulumi/pulumi>/cmd/run --monitor=... <program>`: the run script of the
//     Node.js SDK the program installed from npm (found in node_modules from the program upwards),
//     which compiles TypeScript with the ts-node the SDK vendors. The stack's config travels in
//     PULUMI_CONFIG / PULUMI_CONFIG_SECRET_KEYS; exit code 32 means "bail" (the program already
//     showed the user its error).
//   - GetRequiredPackages lists the node_modules packages whose package.json says
//     `"pulumi": {"resource": true}` (how provider SDKs declare the plugin they need).
//   - GeneratePackage writes a TypeScript SDK for a schema with the nodejs code generator of
//     github.com/pulumi/pulumi/pkg/v3 (the CLI's own release), schemas of dependencies coming from
//     the engine's loader. A local SDK compiles itself with tsc when npm installs it.
//   - Link adds such an SDK to the program's package.json as a `file:` dependency;
//     InstallDependencies runs `npm install` and streams its output.
//
// Anything else (program generation, templates, packing, plugins written in Node.js) answers
// Unimplemented, which the engine treats as "not supported by this language".
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"google.golang.org/grpc"

	"github.com/pulumi/pulumi/pkg/v3/codegen/nodejs"
	"github.com/pulumi/pulumi/pkg/v3/codegen/schema"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"

	"nvlfabric.io/tools/pulumi/langhost"
)

// version is stamped by tools/build.py with -ldflags "-X main.version=...".
var version = "0.0.0-dev"

func main() {
	langhost.Serve("pulumi-language-nodejs", func(engineAddress, root string) pulumirpc.LanguageRuntimeServer {
		return &languageHost{Base: langhost.NewBase(version, engineAddress, root)}
	})
}

type languageHost struct {
	*langhost.Base
}

// node is the Node.js executable: $PULUMI_NODEJS_NODE, else node on PATH.
func node() (string, error) {
	if cmd := os.Getenv("PULUMI_NODEJS_NODE"); cmd != "" {
		return cmd, nil
	}
	path, err := exec.LookPath("node")
	if err != nil {
		return "", errors.New("node is not on PATH: install Node.js (>= 20), or set PULUMI_NODEJS_NODE")
	}
	return path, nil
}

func programDir(info *pulumirpc.ProgramInfo, fallback string) string {
	if info != nil && info.GetProgramDirectory() != "" {
		return info.GetProgramDirectory()
	}
	if fallback != "" {
		return fallback
	}
	return "."
}

// runScript finds @pulumi/pulumi's cmd/run in the node_modules of dir or of a directory above
// it, as Node's own module resolution would.
func runScript(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := abs; ; d = filepath.Dir(d) {
		candidate := filepath.Join(d, "node_modules", "@pulumi", "pulumi", "cmd", "run")
		if _, err := os.Stat(filepath.Join(candidate, "index.js")); err == nil {
			return candidate, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("@pulumi/pulumi is not installed for %s: run `npm install` (or `pulumi install`) "+
				"in the project", abs)
		}
	}
}

type packageJSON struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Pulumi  *struct {
		Resource bool   `json:"resource"`
		Name     string `json:"name"`
		Version  string `json:"version"`
		Server   string `json:"server"`
	} `json:"pulumi"`
}

// requiredPackages lists the plugins the program's installed npm packages declare.
func requiredPackages(dir string) ([]*pulumirpc.PackageDependency, error) {
	modules := filepath.Join(dir, "node_modules")
	var manifests []string
	entries, err := os.ReadDir(modules)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "@") {
			scoped, _ := filepath.Glob(filepath.Join(modules, e.Name(), "*", "package.json"))
			manifests = append(manifests, scoped...)
		} else {
			manifests = append(manifests, filepath.Join(modules, e.Name(), "package.json"))
		}
	}
	sort.Strings(manifests)
	seen := map[string]bool{}
	var deps []*pulumirpc.PackageDependency
	for _, path := range manifests {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var pj packageJSON
		if json.Unmarshal(data, &pj) != nil || pj.Pulumi == nil || !pj.Pulumi.Resource {
			continue
		}
		name := pj.Pulumi.Name
		if name == "" {
			name = strings.TrimPrefix(pj.Name, "@pulumi/")
		}
		v := pj.Pulumi.Version
		if v == "" {
			v = pj.Version
		}
		dep := langhost.Package(name, v, pj.Pulumi.Server)
		if key := name + "@" + dep.GetVersion(); !seen[key] {
			seen[key] = true
			deps = append(deps, dep)
		}
	}
	return deps, nil
}

func (h *languageHost) GetRequiredPackages(
	_ context.Context, req *pulumirpc.GetRequiredPackagesRequest,
) (*pulumirpc.GetRequiredPackagesResponse, error) {
	deps, err := requiredPackages(programDir(req.GetInfo(), ""))
	if err != nil {
		return nil, err
	}
	return &pulumirpc.GetRequiredPackagesResponse{Packages: deps}, nil
}

func (h *languageHost) GetRequiredPlugins(
	_ context.Context, req *pulumirpc.GetRequiredPluginsRequest,
) (*pulumirpc.GetRequiredPluginsResponse, error) {
	deps, err := requiredPackages(programDir(req.GetInfo(), ""))
	if err != nil {
		return nil, err
	}
	return langhost.Plugins(deps), nil
}

// runEnv is the program's environment: the stack's config, and how to treat TypeScript.
func runEnv(req *pulumirpc.RunRequest) ([]string, error) {
	config, err := langhost.ConfigEnv(req)
	if err != nil {
		return nil, err
	}
	env := append(os.Environ(), config...)
	typescript := true
	if opts := req.GetInfo().GetOptions(); opts != nil {
		m := opts.AsMap()
		if ts, ok := m["typescript"].(bool); ok {
			typescript = ts
		}
		if tsconfig, ok := m["tsconfig"].(string); ok && tsconfig != "" {
			env = append(env, "PULUMI_NODEJS_TSCONFIG_PATH="+tsconfig)
		}
	}
	return append(env, fmt.Sprintf("PULUMI_NODEJS_TYPESCRIPT=%t", typescript)), nil
}

func (h *languageHost) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	nodeBin, err := node()
	if err != nil {
		return &pulumirpc.RunResponse{Error: err.Error()}, nil
	}
	dir := programDir(req.GetInfo(), req.GetPwd())
	script, err := runScript(dir)
	if err != nil {
		return &pulumirpc.RunResponse{Error: err.Error()}, nil
	}
	program := dir
	if entry := req.GetInfo().GetEntryPoint(); entry != "" && entry != "." {
		program = filepath.Join(dir, entry)
	}
	args := []string{script,
		"--monitor=" + req.GetMonitorAddress(),
		"--engine=" + h.EngineAddress(),
		"--project=" + req.GetProject(),
		"--stack=" + req.GetStack(),
		"--organization=" + req.GetOrganization(),
		fmt.Sprintf("--parallel=%d", req.GetParallel()),
		"--pwd=" + req.GetPwd(),
	}
	if root := req.GetInfo().GetRootDirectory(); root != "" {
		args = append(args, "--root-directory="+root)
	}
	if req.GetDryRun() {
		args = append(args, "--dry-run")
	}
	args = append(args, program)
	args = append(args, req.GetArgs()...)

	env, err := runEnv(req)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, nodeBin, args...)
	cmd.Dir = req.GetPwd()
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = env
	return langhost.RunResult(cmd.Run(), nodeBin), nil
}

// GeneratePackage writes the TypeScript SDK of a package schema into req.Directory.
func (h *languageHost) GeneratePackage(
	_ context.Context, req *pulumirpc.GeneratePackageRequest,
) (*pulumirpc.GeneratePackageResponse, error) {
	loader, err := schema.NewLoaderClient(req.GetLoaderTarget())
	if err != nil {
		return nil, fmt.Errorf("connecting to the schema loader: %w", err)
	}
	defer loader.Close()
	var spec schema.PackageSpec
	if err := json.Unmarshal([]byte(req.GetSchema()), &spec); err != nil {
		return nil, fmt.Errorf("decoding the package schema: %w", err)
	}
	pkg, diags, err := schema.BindSpec(spec, loader, schema.ValidationOptions{})
	if err != nil {
		return nil, fmt.Errorf("binding the package schema: %w", err)
	}
	if diags.HasErrors() {
		return nil, fmt.Errorf("the package schema of %s is invalid: %s", spec.Name, diags.Error())
	}
	files, err := nodejs.GeneratePackage("pulumi-language-nodejs", pkg, req.GetExtraFiles(),
		req.GetLocalDependencies(), req.GetLocal(), loader)
	if err != nil {
		return nil, fmt.Errorf("generating the TypeScript SDK of %s: %w", spec.Name, err)
	}
	for name, data := range files {
		path := filepath.Join(req.GetDirectory(), name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, data, 0o644); err != nil { //nolint:gosec // SDK sources, not secrets
			return nil, err
		}
	}
	return &pulumirpc.GeneratePackageResponse{}, nil
}

// Link adds each generated SDK to the program's package.json as a `file:` dependency (npm then
// installs it, and its postinstall compiles it).
func (h *languageHost) Link(_ context.Context, req *pulumirpc.LinkRequest) (*pulumirpc.LinkResponse, error) {
	root := programDir(req.GetInfo(), "")
	manifest := filepath.Join(root, "package.json")
	data, err := os.ReadFile(manifest)
	if err != nil {
		return nil, fmt.Errorf("linking into %s: %w (a Node.js project needs a package.json)", root, err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", manifest, err)
	}
	deps, _ := doc["dependencies"].(map[string]any)
	if deps == nil {
		deps = map[string]any{}
	}
	var instructions []string
	for _, dep := range req.GetPackages() {
		var sdk packageJSON
		sdkData, err := os.ReadFile(filepath.Join(root, dep.GetPath(), "package.json"))
		if err == nil {
			err = json.Unmarshal(sdkData, &sdk)
		}
		if err != nil || sdk.Name == "" {
			return nil, fmt.Errorf("the SDK at %s has no usable package.json: %v", dep.GetPath(), err)
		}
		deps[sdk.Name] = "file:" + filepath.ToSlash(dep.GetPath())
		alias := strings.ReplaceAll(dep.GetPackage().GetName(), "-", "_")
		instructions = append(instructions, fmt.Sprintf("import * as %s from %q;", alias, sdk.Name))
	}
	doc["dependencies"] = deps
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(manifest, append(out, '\n'), 0o644); err != nil { //nolint:gosec // package.json
		return nil, err
	}
	return &pulumirpc.LinkResponse{ImportInstructions: strings.Join(instructions, "\n")}, nil
}

// InstallDependencies runs `npm install` in the program's directory, streaming its output.
func (h *languageHost) InstallDependencies(
	req *pulumirpc.InstallDependenciesRequest,
	stream grpc.ServerStreamingServer[pulumirpc.InstallDependenciesResponse],
) error {
	dir := programDir(req.GetInfo(), req.GetDirectory())
	if _, err := os.Stat(filepath.Join(dir, "package.json")); err != nil {
		return stream.Send(&pulumirpc.InstallDependenciesResponse{Stdout: []byte("no package.json; nothing to install\n")})
	}
	var buf bytes.Buffer
	cmd := exec.CommandContext(stream.Context(), "npm", "install", "--no-audit", "--no-fund")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	if sendErr := stream.Send(&pulumirpc.InstallDependenciesResponse{Stdout: buf.Bytes()}); sendErr != nil {
		return sendErr
	}
	if err != nil {
		return fmt.Errorf("npm install in %s: %w", dir, err)
	}
	return nil
}

func (h *languageHost) GetProgramDependencies(
	_ context.Context, req *pulumirpc.GetProgramDependenciesRequest,
) (*pulumirpc.GetProgramDependenciesResponse, error) {
	dir := programDir(req.GetInfo(), "")
	data, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		return nil, err
	}
	var doc struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	resp := &pulumirpc.GetProgramDependenciesResponse{}
	for name, want := range doc.Dependencies {
		v := want
		var installed packageJSON
		if b, err := os.ReadFile(filepath.Join(dir, "node_modules", name, "package.json")); err == nil &&
			json.Unmarshal(b, &installed) == nil && installed.Version != "" {
			v = installed.Version
		}
		resp.Dependencies = append(resp.Dependencies, &pulumirpc.DependencyInfo{Name: name, Version: v})
	}
	sort.Slice(resp.Dependencies, func(i, j int) bool { return resp.Dependencies[i].Name < resp.Dependencies[j].Name })
	return resp, nil
}

func (h *languageHost) About(context.Context, *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	nodeBin, err := node()
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(nodeBin, "--version").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s --version: %w", nodeBin, err)
	}
	return &pulumirpc.AboutResponse{Executable: nodeBin, Version: strings.TrimPrefix(strings.TrimSpace(string(out)), "v")}, nil
}
