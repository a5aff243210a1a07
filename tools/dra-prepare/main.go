// Command dra-prepare plays the kubelet's half of a DRA kubelet plugin's gRPC service
// (k8s.io/kubelet/pkg/apis/dra/v1): NodePrepareResources or NodeUnprepareResources for one
// ResourceClaim, over the plugin's unix socket, and prints the plugin's answer as JSON.
//
// It lets a test drive NVIDIA's gpu-kubelet-plugin through prepare (which writes the claim's
// CDI spec) on a machine without a kubelet; the real kubelet makes the same call.
//
//	dra-prepare -socket .../plugins/gpu.nvidia.com/dra.sock -namespace NS -name NAME -uid UID [-unprepare]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

func main() {
	socket := flag.String("socket", "", "the plugin's DRA service socket (<plugins dir>/<driver>/dra.sock)")
	namespace := flag.String("namespace", "", "the ResourceClaim's namespace")
	name := flag.String("name", "", "the ResourceClaim's name")
	uid := flag.String("uid", "", "the ResourceClaim's UID")
	unprepare := flag.Bool("unprepare", false, "call NodeUnprepareResources instead")
	timeout := flag.Duration("timeout", 60*time.Second, "how long the call may take")
	flag.Parse()
	if *socket == "" || *namespace == "" || *name == "" || *uid == "" {
		flag.Usage()
		os.Exit(2)
	}

	conn, err := grpc.NewClient("unix://"+*socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "dra-prepare: connect %s: %v\n", *socket, err)
		os.Exit(1)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	client := drapb.NewDRAPluginClient(conn)
	claim := &drapb.Claim{Namespace: *namespace, Name: *name, Uid: *uid}
	var out any
	if *unprepare {
		out, err = client.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{claim}})
	} else {
		out, err = client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{claim}})
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "dra-prepare: %v\n", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "dra-prepare: %v\n", err)
		os.Exit(1)
	}
}
