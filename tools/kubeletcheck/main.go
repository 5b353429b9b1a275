// Command kubeletcheck plays the kubelet's side of the DRA plugin contract against a plugin's
// sockets, using the official generated gRPC clients of k8s.io/kubelet (pluginregistration/v1,
// dra/v1, dra/v1beta1). It proves that a plugin whose protos were written elsewhere (ours are
// written from the field tables) is wire-compatible with the real kubelet.
//
//	kubeletcheck -registration <reg.sock> [-claim ns/name/uid ...] [-version auto|v1|v1beta1]
//
// It prints one JSON document: the GetInfo answer, the service chosen the kubelet's way, and the
// NodePrepareResources / NodeUnprepareResources responses for the given claims.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type claimFlags []string

func (c *claimFlags) String() string     { return strings.Join(*c, ",") }
func (c *claimFlags) Set(v string) error { *c = append(*c, v); return nil }

type device struct {
	RequestNames []string `json:"requestNames"`
	PoolName     string   `json:"poolName"`
	DeviceName   string   `json:"deviceName"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
}

type result struct {
	Info      map[string]any         `json:"info"`
	Service   string                 `json:"service"`
	Prepare   map[string]claimResult `json:"prepare,omitempty"`
	Unprepare map[string]string      `json:"unprepare,omitempty"`
	Errors    []string               `json:"errors,omitempty"`
}

type claimResult struct {
	Devices []device `json:"devices"`
	Error   string   `json:"error"`
}

func main() {
	regSock := flag.String("registration", "", "path of the plugin's registration socket")
	version := flag.String("version", "auto", "DRA service: auto (the kubelet's choice), v1 or v1beta1")
	timeout := flag.Duration("timeout", 45*time.Second, "per-call timeout (the kubelet uses 45s)")
	var claims claimFlags
	flag.Var(&claims, "claim", "namespace/name/uid of a claim to prepare and unprepare (repeatable)")
	flag.Parse()
	if *regSock == "" {
		fmt.Fprintln(os.Stderr, "kubeletcheck: -registration is required")
		os.Exit(2)
	}
	out := result{}
	if err := run(*regSock, *version, *timeout, claims, &out); err != nil {
		out.Errors = append(out.Errors, err.Error())
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
	if len(out.Errors) > 0 {
		os.Exit(1)
	}
}

func dial(path string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func run(regSock, version string, timeout time.Duration, claims []string, out *result) error {
	conn, err := dial(regSock)
	if err != nil {
		return fmt.Errorf("dial %s: %w", regSock, err)
	}
	defer conn.Close()
	reg := registration.NewRegistrationClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second) // the kubelet's GetInfo budget
	defer cancel()
	info, err := reg.GetInfo(ctx, &registration.InfoRequest{})
	if err != nil {
		return fmt.Errorf("GetInfo: %w", err)
	}
	out.Info = map[string]any{"type": info.Type, "name": info.Name, "endpoint": info.Endpoint,
		"supportedVersions": info.SupportedVersions}
	service := ""
	for _, v := range info.SupportedVersions { // the plugin's order decides, as in kubelet 1.34+
		if v == "v1.DRAPlugin" || v == "v1beta1.DRAPlugin" {
			service = v
			break
		}
	}
	if version != "auto" {
		service = version + ".DRAPlugin"
	}
	out.Service = service
	status := &registration.RegistrationStatus{PluginRegistered: service != ""}
	if service == "" {
		status.Error = "no supported DRA service"
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, status); err != nil {
		return fmt.Errorf("NotifyRegistrationStatus: %w", err)
	}
	if service == "" || len(claims) == 0 {
		return nil
	}
	endpoint := info.Endpoint
	if endpoint == "" {
		endpoint = regSock
	}
	dra, err := dial(endpoint)
	if err != nil {
		return fmt.Errorf("dial %s: %w", endpoint, err)
	}
	defer dra.Close()
	out.Prepare = map[string]claimResult{}
	out.Unprepare = map[string]string{}
	callCtx, callCancel := context.WithTimeout(context.Background(), timeout)
	defer callCancel()
	if service == "v1.DRAPlugin" {
		return callV1(callCtx, drav1.NewDRAPluginClient(dra), claims, out)
	}
	return callV1beta1(callCtx, drav1beta1.NewDRAPluginClient(dra), claims, out)
}

func parseClaim(s string) (ns, name, uid string, err error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return "", "", "", fmt.Errorf("claim %q: want namespace/name/uid", s)
	}
	return parts[0], parts[1], parts[2], nil
}

func callV1(ctx context.Context, c drav1.DRAPluginClient, claims []string, out *result) error {
	req := &drav1.NodePrepareResourcesRequest{}
	unreq := &drav1.NodeUnprepareResourcesRequest{}
	for _, s := range claims {
		ns, name, uid, err := parseClaim(s)
		if err != nil {
			return err
		}
		req.Claims = append(req.Claims, &drav1.Claim{Namespace: ns, Name: name, Uid: uid})
		unreq.Claims = append(unreq.Claims, &drav1.Claim{Namespace: ns, Name: name, Uid: uid})
	}
	resp, err := c.NodePrepareResources(ctx, req)
	if err != nil {
		return fmt.Errorf("NodePrepareResources: %w", err)
	}
	for uid, r := range resp.Claims {
		cr := claimResult{Error: r.Error}
		for _, d := range r.Devices {
			cr.Devices = append(cr.Devices, device{d.RequestNames, d.PoolName, d.DeviceName, d.CdiDeviceIds})
		}
		out.Prepare[uid] = cr
	}
	uresp, err := c.NodeUnprepareResources(ctx, unreq)
	if err != nil {
		return fmt.Errorf("NodeUnprepareResources: %w", err)
	}
	for uid, r := range uresp.Claims {
		out.Unprepare[uid] = r.Error
	}
	return nil
}

func callV1beta1(ctx context.Context, c drav1beta1.DRAPluginClient, claims []string, out *result) error {
	req := &drav1beta1.NodePrepareResourcesRequest{}
	unreq := &drav1beta1.NodeUnprepareResourcesRequest{}
	for _, s := range claims {
		ns, name, uid, err := parseClaim(s)
		if err != nil {
			return err
		}
		req.Claims = append(req.Claims, &drav1beta1.Claim{Namespace: ns, Name: name, Uid: uid})
		unreq.Claims = append(unreq.Claims, &drav1beta1.Claim{Namespace: ns, Name: name, Uid: uid})
	}
	resp, err := c.NodePrepareResources(ctx, req)
	if err != nil {
		return fmt.Errorf("NodePrepareResources: %w", err)
	}
	for uid, r := range resp.Claims {
		cr := claimResult{Error: r.Error}
		for _, d := range r.Devices {
			cr.Devices = append(cr.Devices, device{d.RequestNames, d.PoolName, d.DeviceName, d.CdiDeviceIds})
		}
		out.Prepare[uid] = cr
	}
	uresp, err := c.NodeUnprepareResources(ctx, unreq)
	if err != nil {
		return fmt.Errorf("NodeUnprepareResources: %w", err)
	}
	for uid, r := range uresp.Claims {
		out.Unprepare[uid] = r.Error
	}
	return nil
}
