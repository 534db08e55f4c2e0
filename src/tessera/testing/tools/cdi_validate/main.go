// cdi-validate: tessera's CDI specs checked by the CDI reference implementation
// (tags.cncf.io/container-device-interface, what containerd and CRI-O link), for the tests.
//
//	cdi-validate SPEC_DIR [DEVICE...]
//
// Every spec file in SPEC_DIR is read with cdi.ReadSpec (schema, version, kind, device names,
// edits); then a cache over SPEC_DIR injects DEVICE... (fully qualified CDI names) into an empty
// OCI runtime spec, as a runtime does for a container. Prints one JSON object: specErrors (file
// -> error), cacheErrors, devices (what the cache resolved), unresolved, injectError and oci (the
// spec after injection: env, mounts, device nodes, hooks).
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cdi-validate SPEC_DIR [DEVICE...]")
		os.Exit(2)
	}
	dir := os.Args[1]
	out := map[string]any{}
	specErrors := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		if _, err := cdi.ReadSpec(filepath.Join(dir, e.Name()), 0); err != nil {
			specErrors[e.Name()] = err.Error()
		}
	}
	out["specErrors"] = specErrors
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		out["cacheError"] = err.Error()
	} else {
		cacheErrors := map[string][]string{}
		for path, errs := range cache.GetErrors() {
			for _, e := range errs {
				cacheErrors[path] = append(cacheErrors[path], e.Error())
			}
		}
		out["cacheErrors"] = cacheErrors
		devices := cache.ListDevices()
		sort.Strings(devices)
		out["devices"] = devices
		spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
		unresolved, err := cache.InjectDevices(spec, os.Args[2:]...)
		out["unresolved"] = unresolved
		if err != nil {
			out["injectError"] = err.Error()
		}
		out["oci"] = spec
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(1)
	}
}
