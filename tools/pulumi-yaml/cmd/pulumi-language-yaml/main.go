// Command pulumi-language-yaml is Pulumi's YAML language host (github.com/pulumi/pulumi-yaml
// v1.25.0, its pkg/server unchanged) with the two things our v3.260.0 CLI needs from it:
//
//   - Link. `pulumi package add` (CLI >= 3.2xx) calls LanguageRuntime.Link after generating an
//     SDK, and v1.25.0 answers Unimplemented, which fails the command. For YAML there is nothing
//     to link: the SDK is a lock file (sdks/<pkg>-<version>.yaml) that the host reads itself, and
//     the CLI records the package in Pulumi.yaml. So Link succeeds with no instructions.
//   - Schemas through the engine. Upstream's main loads package schemas with a plugin host of its
//     own (sdk v3.206.0), which looks for language plugins beside its own binary and in the plugin
//     cache, so with PULUMI_IGNORE_AMBIENT_PLUGINS (our offline setting) it cannot find the Python
//     host that runs a Python component provider. With the RPC loader (the request's loader
//     target) the engine loads them, with the same lookup as every other plugin.
//
// Everything else (flags, health check, serving) is upstream's main.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/pulumi/pulumi-yaml/pkg/server"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/cmdutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/logging"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"google.golang.org/grpc"
)

// host is upstream's language host plus Link.
type host struct {
	pulumirpc.LanguageRuntimeServer
}

// Link has nothing to do for YAML (see the package comment).
func (host) Link(context.Context, *pulumirpc.LinkRequest) (*pulumirpc.LinkResponse, error) {
	return &pulumirpc.LinkResponse{}, nil
}

func main() {
	var tracing, root, compiler string
	flag.StringVar(&tracing, "tracing", "", "Emit tracing to a Zipkin-compatible tracing endpoint")
	flag.StringVar(&root, "root", "", "Root of the program execution")
	flag.StringVar(&compiler, "compiler", "", "[obsolete] Compiler to use to pre-process YAML")
	flag.Parse()
	args := flag.Args()
	logging.InitLogging(false, 0, false)
	cmdutil.InitTracing("pulumi-language-yaml", "pulumi-language-yaml", tracing)

	var engineAddress string
	var cancel chan bool
	if len(args) > 0 {
		engineAddress = args[0]
		var err error
		if cancel, err = healthChecks(engineAddress); err != nil {
			cmdutil.Exit(fmt.Errorf("could not start health check host RPC server: %w", err))
		}
	}

	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Cancel: cancel,
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, host{server.NewLanguageHost(engineAddress, tracing,
				true /* useRPCLoader */)})
			return nil
		},
	})
	if err != nil {
		cmdutil.Exit(fmt.Errorf("could not start language host RPC server: %w", err))
	}
	// The engine reads the port from our first line of stdout.
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		cmdutil.Exit(fmt.Errorf("language host RPC stopped serving: %w", err))
	}
}

// healthChecks returns a channel closed when the engine stops answering or on SIGINT.
func healthChecks(engineAddress string) (chan bool, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	cancel := make(chan bool)
	go func() {
		<-ctx.Done()
		stop()
		close(cancel)
	}()
	if err := rpcutil.Healthcheck(ctx, engineAddress, 5*time.Minute, stop); err != nil {
		return nil, err
	}
	return cancel, nil
}
