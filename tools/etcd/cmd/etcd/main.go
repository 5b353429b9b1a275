// Command etcd runs etcd's server entry point unchanged; it exists so that tools/build.py can
// build etcd from its published server module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
