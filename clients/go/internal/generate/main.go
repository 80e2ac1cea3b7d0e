// Command generate writes the Go code for the repository's proto/ into the
// client module (oncegatev1/) and the sidecar's table of characters an award
// id may not hold (award_id_chars.go, from clients/vectors/), or with -check reports whether the files
// there are what the pinned generators produce.
//
// No protoc is needed: protocompile (a pure-Go compiler) parses proto/ and
// the two plugins, protoc-gen-go and protoc-gen-go-grpc, are this module's
// tools (`go tool`), so their versions are pinned by this go.mod and go.sum.
//
//	go -C clients/go/internal/generate run .          # regenerate
//	go -C clients/go/internal/generate run . -check   # exit 1 on any difference
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

// The client module's path; generated files are written relative to its root.
const module = "github.com/oncegate/oncegate/clients/go"

// The files generated, and the Go package they go into.
var (
	sources   = []string{"oncegate/v1/gate.proto", "oncegate/v1/effects.proto"}
	goPackage = module + "/oncegatev1;oncegatev1"
	plugins   = []string{"protoc-gen-go", "protoc-gen-go-grpc"}
)

func main() {
	here, _ := os.Getwd()
	protoDir := flag.String("proto", filepath.Join(here, "../../../../proto"), "the repository's proto/ directory")
	outDir := flag.String("out", filepath.Join(here, "../.."), "the client module's root")
	check := flag.Bool("check", false, "compare with the files on disk instead of writing them")
	flag.Parse()
	if err := run(*protoDir, *outDir, *check); err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
}

func run(protoDir, outDir string, check bool) error {
	req, err := request(protoDir)
	if err != nil {
		return err
	}
	var stale []string
	tbl, err := tableFile(filepath.Join(protoDir, "..", filepath.FromSlash(tableSource)))
	if err != nil {
		return err
	}
	files := []*pluginpb.CodeGeneratorResponse_File{{Name: proto.String("award_id_chars.go"), Content: proto.String(string(tbl))}}
	for _, plugin := range plugins {
		out, err := runPlugin(plugin, req)
		if err != nil {
			return err
		}
		files = append(files, out...)
	}
	for _, f := range files {
		path := filepath.Join(outDir, filepath.FromSlash(f.GetName()))
		if check {
			if old, err := os.ReadFile(path); err != nil || !bytes.Equal(old, []byte(f.GetContent())) {
				stale = append(stale, f.GetName())
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(f.GetContent()), 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", f.GetName())
	}
	if len(stale) > 0 {
		return fmt.Errorf("generated code differs from proto/ or clients/vectors/ (run: go -C clients/go/internal/generate run .): %s",
			strings.Join(stale, ", "))
	}
	return nil
}

// request compiles proto/ and builds what protoc would hand a plugin.
func request(protoDir string) (*pluginpb.CodeGeneratorRequest, error) {
	compiler := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			ImportPaths: []string{protoDir},
		}),
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	files, err := compiler.Compile(context.Background(), sources...)
	if err != nil {
		return nil, fmt.Errorf("compiling %s: %w", protoDir, err)
	}
	var ordered []*descriptorpb.FileDescriptorProto
	seen := map[string]bool{}
	var visit func(protoreflect.FileDescriptor)
	visit = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := 0; i < imports.Len(); i++ {
			visit(imports.Get(i).FileDescriptor)
		}
		ordered = append(ordered, protodesc.ToFileDescriptorProto(fd))
	}
	for _, f := range files {
		visit(f)
	}
	var params []string
	for _, s := range sources {
		params = append(params, "M"+s+"="+goPackage)
	}
	params = append(params, "module="+module)
	return &pluginpb.CodeGeneratorRequest{
		FileToGenerate: sources,
		Parameter:      proto.String(strings.Join(params, ",")),
		ProtoFile:      ordered,
	}, nil
}

// runPlugin runs one of this module's tools as protoc would: the request on
// its standard input, the response on its standard output.
func runPlugin(name string, req *pluginpb.CodeGeneratorRequest) ([]*pluginpb.CodeGeneratorResponse_File, error) {
	in, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("go", "tool", name)
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go tool %s: %w", name, err)
	}
	var resp pluginpb.CodeGeneratorResponse
	if err := proto.Unmarshal(out, &resp); err != nil {
		return nil, fmt.Errorf("%s: reading its response: %w", name, err)
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("%s: %s", name, resp.GetError())
	}
	return resp.File, nil
}
