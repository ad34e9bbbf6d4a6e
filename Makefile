# Cutover build, test and lab entry points. `make help` lists them.
SHELL := /bin/bash
GO ?= go
BIN := bin
GOBIN_TOOLS := $(CURDIR)/$(BIN)/tools
PKGS := ./...
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/cutover-dev/cutover/pkg/version.Version=$(VERSION)
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
GOLANGCI_VERSION := v2.15.0 # pinned in tools/go.mod

.PHONY: images agent-debs release release-manifests help build lab kube-tools fuzz-smoke test test-unit test-priv lint fmt vet proto proto-check tools bench clean demo bench-lab bench-lab-n8 bench-lab-n32 bench-lab-n32-rounds bench-lab-ovs-n16-rounds bench-kernel-commit bench-ovs-flip bench-agent lab-late lab-meter bench-pathcheck bench-coordinator bench-lab-staged bench-lab-staged-n32 bench-ovs-port-stall bench-coordinator-ab cluster-tools cluster-e2e

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## build agent, coordinator, coordctl and the kubectl-cutover plugin into bin/
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./agent/cmd/agent ./coordinator/cmd/coordinator ./coordinator/cmd/coordctl ./coordinator/cmd/kubectl-cutover

RELEASE_DIR ?= $(BIN)/release
RELEASE_OVERLAYS := openshift flannel calico full
# Every overlay rendered with both images tagged $(VERSION) (never
# :latest): what a release publishes beside the images.
release-manifests: ## render deploy/overlays/* with images tagged $(VERSION) into $(RELEASE_DIR)/
	@mkdir -p $(RELEASE_DIR)
	set -e; k=$$(hack/kube-tools.sh kustomize); for o in $(RELEASE_OVERLAYS); do \
	  d=$$(mktemp -d); cp -r deploy $$d/; \
	  printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [deploy/overlays/%s]\nimages:\n- {name: ghcr.io/cutover-dev/cutover-agent, newTag: "%s"}\n- {name: ghcr.io/cutover-dev/cutover-coordinator, newTag: "%s"}\n' $$o '$(VERSION)' '$(VERSION)' > $$d/kustomization.yaml; \
	  $$k build $$d > $(RELEASE_DIR)/cutover-$$o-$(VERSION).yaml; rm -rf $$d; \
	  if grep -q ':latest' $(RELEASE_DIR)/cutover-$$o-$(VERSION).yaml; then echo "$$o: :latest in the rendered manifests"; exit 1; fi; \
	done; ls $(RELEASE_DIR)

# Image tarballs (OCI image layout, linux/amd64 + linux/arm64 in one index
# each) built with go-containerregistry, no registry or container engine
# (harness/image, docs/deploy.md "Images"), each read back and checked. The
# agent's root is assembled from Debian packages (AGENT_PACKAGES and their
# Depends closure), cached per machine by agent-debs; Dockerfile.agent
# installs the same set (deploy/images_test.go).
AGENT_PACKAGES := iptables nftables openvswitch-common openvswitch-switch iproute2
IMAGE_ARCHES ?= amd64 arm64
agent-debs: ## download (once per version, cached per machine) the Debian packages of the agent image for IMAGE_ARCHES
	set -e; for a in $(IMAGE_ARCHES); do hack/agent-debs.sh $$a $(AGENT_PACKAGES); done

images: agent-debs ## build the agent, coordinator and pause image tarballs tagged $(VERSION) into $(RELEASE_DIR)/
	set -e; for a in $(IMAGE_ARCHES); do \
	  CGO_ENABLED=0 GOOS=linux GOARCH=$$a $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/linux-$$a/ ./agent/cmd/agent ./coordinator/cmd/coordinator ./coordinator/cmd/coordctl ./harness/cmd/cutover-pause; \
	done
	$(GO) run ./harness/cmd/cutover-image --version '$(VERSION)' --bin $(BIN) --out $(RELEASE_DIR) --arch $$(echo $(IMAGE_ARCHES) | tr ' ' ,)

# A release (hack/release.sh): VERSION must be vX.Y.Z with a CHANGELOG.md
# section. Manifests per overlay pinned to the images' digests, the image
# tarballs, coordctl and kubectl-cutover for linux and darwin on amd64 and
# arm64, RELEASE-NOTES.md and SHA256SUMS, into $(RELEASE_DIR)/$(VERSION)/.
release: kube-tools ## make release VERSION=vX.Y.Z: manifests pinned by digest, image tarballs, CLIs, notes, SHA256SUMS into $(RELEASE_DIR)/$(VERSION)/
	VERSION='$(VERSION)' RELEASE_ROOT=$(RELEASE_DIR) RELEASE_OVERLAYS='$(RELEASE_OVERLAYS)' IMAGE_ARCHES='$(IMAGE_ARCHES)' AGENT_PACKAGES='$(AGENT_PACKAGES)' hack/release.sh

# The lab's CLI is a test harness (harness/): its own binary, so no shipped
# binary links the lab. It runs the agent and coordinator beside it in bin/.
lab: build ## build the shipped binaries and cutover-lab (the local lab's CLI, docs/lab.md) into bin/
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./harness/cmd/cutover-lab

# The lab end-to-end packages (whole clusters of namespaces, OVS and real
# binaries, measuring disruption) run after the rest, one package at a time,
# so their timing-sensitive figures are not taken on a machine saturated by
# the other packages' tests. Within them, one test at a time (-parallel 1):
# an 8-node lab alone loads 2 cores to 8-9; two at once reached 10-12 and
# measured each other (the e2e's worst pair per operation 3-25 in two runs
# of the package, 5-12 in one run one test at a time).
LAB_PKGS := ./harness/lab/...

test: lint lab kube-tools ## the full suite: lint, unit tier, privileged tier when root (CI is root), Kubernetes tier, lab end to end, real cluster
	$(GO) test -race -count=1 -timeout 40m $$($(GO) list $(PKGS) | grep -v -e '/harness/lab' -e '/harness/cluster')
	$(GO) test -race -count=1 -p 1 -parallel 1 -timeout 40m $(LAB_PKGS)
	hack/fuzz-smoke.sh $(FUZZ_EXECS)
	$(MAKE) cluster-e2e

FUZZ_EXECS ?= 50000
fuzz-smoke: ## run every Fuzz* target for FUZZ_EXECS executions each beyond its seed corpus
	hack/fuzz-smoke.sh $(FUZZ_EXECS)

test-unit: ## unit tier only (no root needed)
	$(GO) test -race -count=1 -short $(PKGS)

fmt: ## gofmt the tree
	gofmt -s -w $$(git ls-files '*.go')

vet:
	$(GO) vet $(PKGS)

lint: vet tools ## gofmt check, go vet, golangci-lint (pinned)
	@out=$$(gofmt -s -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GOBIN_TOOLS)/golangci-lint run $(PKGS)

tools: $(GOBIN_TOOLS)/golangci-lint $(GOBIN_TOOLS)/protoc-gen-go $(GOBIN_TOOLS)/protoc-gen-go-grpc ## install pinned tools into bin/tools

$(GOBIN_TOOLS)/golangci-lint:
	cd tools && GOBIN=$(GOBIN_TOOLS) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint
$(GOBIN_TOOLS)/protoc-gen-go:
	cd tools && GOBIN=$(GOBIN_TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go
$(GOBIN_TOOLS)/protoc-gen-go-grpc:
	cd tools && GOBIN=$(GOBIN_TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc

PROTOS := $(shell find proto -name '*.proto')
proto: $(GOBIN_TOOLS)/protoc-gen-go $(GOBIN_TOOLS)/protoc-gen-go-grpc ## regenerate the gRPC code beside the .proto files
	PATH=$(GOBIN_TOOLS):$$PATH protoc -I proto --go_out=proto --go_opt=paths=source_relative \
		--go-grpc_out=proto --go-grpc_opt=paths=source_relative $(PROTOS)

bench: build ## benchmarks: print figures and write results/*.json
	@mkdir -p results
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./... | tee results/bench.txt

demo: ## as root: an 8-node lab, a real `coordctl cutover --port 4889` (cutover-lab cutover), measured and read back (hack/demo.sh)
	hack/demo.sh

lab-late: build lab ## a frozen agent after commit (1s/6s/never) under both late policies: results/late_commit.json, docs/faults.md
	mkdir -p results
	CI=true LATE_MATRIX=1 LATE_RESULTS=$(CURDIR)/results/late_commit.json flock /tmp/cutover-priv.lock $(GO) test -count=1 -timeout 30m -run 'TestLateCommit' -v ./harness/lab/faults/

lab-meter: build lab ## the probe mesh against an independent echo ring during cutovers, and with one agent frozen (also during a staged and an atomic switch) (kernel-vxlan, N=8, 1ms x 2 peers): results/meter_agreement.json, docs/lab.md
	mkdir -p results
	CI=true METER_RESULTS=$(CURDIR)/results/meter_agreement.json flock /tmp/cutover-priv.lock $(GO) test -count=1 -timeout 20m -run 'TestMeterAgreement|TestAgentStallExplainsItsGaps|TestFrozenNodeStagedVsAtomic' -v ./harness/lab/

bench-lab: ## lab cutover benchmark (N=8,16,32; field-report loop vs parallel vs Cutover): results/lab_cutover.json, docs/benchmarks.md
	@mkdir -p results
	set -o pipefail; cd harness/lab && flock /tmp/cutover-priv.lock $(GO) test -run '^$$' -bench '^BenchmarkLabCutover$$' -benchtime 1x -timeout 60m . | tee ../../results/bench-lab.txt

bench-lab-n8: lab ## limit, parallel, atomic and staged at N=8, probes every 1 ms, both backends, in 5 alternating rounds (COT_LAB_BENCH_ROUNDS), median and range of each, where the effect spread goes: results/lab_cutover_n8.json, docs/benchmarks.md
	@mkdir -p results
	set -o pipefail; cd harness/lab && CUTOVER_BENCH_TOOL='make bench-lab-n8' COT_LAB_BENCH_NAME=lab_cutover_n8 flock -w 1800 /tmp/cutover-priv.lock \
		$(GO) test -run '^$$' -bench BenchmarkLabCutoverRounds -benchtime 1x -timeout 40m . | tee ../../results/bench-lab-n8.txt

bench-lab-staged: lab ## the staged strategy beside the others at N=8, probes every 1 ms, both backends: results/lab_staged_n8.json, docs/benchmarks.md
	@mkdir -p results
	set -o pipefail; cd harness/lab && COT_LAB_BENCH_NAME=lab_staged_n8 COT_LAB_BENCH_SIZES=8 flock /tmp/cutover-priv.lock \
		$(GO) test -run '^$$' -bench '^BenchmarkLabCutover$$' -benchtime 1x -timeout 30m . | tee ../../results/bench-lab-staged.txt

bench-ovs-port-stall: lab ## what one node's OVS port or flow change alone costs its pairs at N=8 and 32: results/ovs_port_stall.json, docs/staged.md
	@mkdir -p results
	set -o pipefail; cd harness/lab && flock /tmp/cutover-priv.lock $(GO) test -run '^$$' -bench BenchmarkOVSPortStall -benchtime 1x -timeout 40m . | tee ../../results/bench-ovs-port-stall.txt

bench-lab-staged-n32: lab ## the staged strategy one node at a time (--max-parallel 1) beside the others at N=32, probes every 10 ms, both backends: results/lab_staged_n32_10ms.json, docs/benchmarks.md
	@mkdir -p results
	set -o pipefail; cd harness/lab && COT_LAB_BENCH_NAME=lab_staged_n32_10ms COT_LAB_BENCH_SIZES=32 COT_LAB_BENCH_INTERVAL=10ms COT_LAB_BENCH_LATE_BUDGET=3s COT_LAB_BENCH_MAX_PARALLEL=1 flock /tmp/cutover-priv.lock \
		$(GO) test -run '^$$' -bench '^BenchmarkLabCutover$$' -benchtime 1x -timeout 60m . | tee ../../results/bench-lab-staged-n32.txt

bench-lab-ovs-n16-rounds: lab ## OVS at N=16, probes every 1 ms (the largest OVS lab this machine runs at 1 ms without losing probes idle): limit, atomic and staged in 3 alternating rounds (COT_LAB_BENCH_ROUNDS), on which the agents' OVS advice to strategy auto rests: results/lab_ovs_n16_rounds.json, docs/benchmarks.md
	@mkdir -p results
	set -o pipefail; cd harness/lab && CUTOVER_BENCH_TOOL='make bench-lab-ovs-n16-rounds' COT_LAB_BENCH_NAME=lab_ovs_n16_rounds COT_LAB_BENCH_NODES=16 COT_LAB_BENCH_INTERVAL=1ms COT_LAB_BENCH_BACKENDS=ovs \
		COT_LAB_BENCH_ROUNDS=$${COT_LAB_BENCH_ROUNDS:-3} COT_LAB_BENCH_METHODS=limit,cutover,staged flock -w 1800 /tmp/cutover-priv.lock \
		$(GO) test -run '^$$' -bench BenchmarkLabCutoverRounds -benchtime 1x -timeout 40m . | tee ../../results/bench-lab-ovs-n16-rounds.txt

bench-lab-n32: lab ## lab cutover at N=32 with probes every 10 ms (above the 2-core noise floor), both backends: results/lab_cutover_n32_10ms.json, docs/benchmarks.md
	@mkdir -p results
	set -o pipefail; cd harness/lab && COT_LAB_BENCH_NAME=lab_cutover_n32_10ms COT_LAB_BENCH_SIZES=32 COT_LAB_BENCH_INTERVAL=10ms COT_LAB_BENCH_LATE_BUDGET=3s flock /tmp/cutover-priv.lock \
		$(GO) test -run '^$$' -bench '^BenchmarkLabCutover$$' -benchtime 1x -timeout 60m . | tee ../../results/bench-lab-n32.txt

bench-lab-n32-rounds: lab ## limit, atomic and staged at N=32 on this machine, probes every 10 ms, both backends, 3 alternating rounds (COT_LAB_BENCH_ROUNDS), with apply-to-answer per node: results/lab_cutover_n32_rounds.json, docs/benchmarks.md (the many-core machine's are hack/manycore-run.sh's)
	@mkdir -p results
	set -o pipefail; cd harness/lab && CUTOVER_BENCH_TOOL='make bench-lab-n32-rounds' COT_LAB_BENCH_NAME=lab_cutover_n32_rounds COT_LAB_BENCH_NODES=32 COT_LAB_BENCH_INTERVAL=10ms \
		COT_LAB_BENCH_LATE_BUDGET=3s COT_LAB_BENCH_ROUNDS=$${COT_LAB_BENCH_ROUNDS:-3} COT_LAB_BENCH_METHODS=$${COT_LAB_BENCH_METHODS:-limit,cutover,staged} flock -w 1800 /tmp/cutover-priv.lock \
		$(GO) test -run '^$$' -bench BenchmarkLabCutoverRounds -benchtime 1x -timeout 60m . | tee ../../results/bench-lab-n32-rounds.txt

bench-pathcheck: ## underlay path check time (coordctl pathcheck) at N=8, both backends (COT_PATH_BENCH_SIZES to change): results/path_check.json, docs/benchmarks.md
	@mkdir -p results
	set -o pipefail; cd harness/lab && CI=true COT_PATH_BENCH_SIZES=$${COT_PATH_BENCH_SIZES:-8} flock /tmp/cutover-priv.lock $(GO) test -run '^$$' -bench BenchmarkPathCheck -benchtime 1x -timeout 30m . | tee ../../results/bench-pathcheck.txt

manycore-bundle: ## what travels to the many-core machine for N=32/64 at 1 ms (hack/manycore-run.sh runs it there): static binaries, the lab's test binary and tools into .manycore/
	hack/manycore-bundle.sh

bench-agent: lab ## the agent at rest in an 8-node lab, probe mesh at its default rate, at 1 ms (3 rounds beside the base agent), idle and off: RSS and CPU, results/agent_footprint.json, docs/benchmarks.md
	CI=true flock /tmp/cutover-priv.lock $(GO) test -run '^$$' -bench BenchmarkAgentFootprint -benchtime 1x -timeout 30m ./harness/lab/

bench-coordinator: ## the real coordinator over 1,000 and 10,000 simulated agents (COT_SCALE_SIM_SIZES), and what its idle agent connections hold: results/coordinator_scale_sim.json, results/agent_conn_memory.json, docs/benchmarks.md
	$(GO) test -run '^$$' -bench 'BenchmarkCoordinatorScaleSim|BenchmarkAgentConnMemory' -benchtime 1x -timeout 30m ./coordinator/

AB_BASE ?= HEAD
bench-coordinator-ab: ## the coordinator benchmark for AB_BASE (a commit) and this tree, interleaved on the same machine: results/coordinator_ab.json (coordinator_ab_$$AB_NAME.json with AB_NAME), docs/benchmarks.md
	AB_NAME=$(AB_NAME) hack/bench-coordinator-ab.sh $(AB_BASE)

bench-ovs-flip: ## one node's OVS dst_port flip: native OVSDB, prepared (Apply only) and ovs-vsctl: results/ovs_flip.json, docs/benchmarks.md
	flock /tmp/cutover-priv.lock $(GO) test -run '^$$' -bench BenchmarkFlip -benchtime 1x -timeout 10m ./pkg/ovs/

bench-kernel-commit: ## kernel-vxlan backend commit window (BenchmarkBackendCommit): results/kernel_backend_commit.json, docs/kernel-vxlan.md
	$(GO) test -run '^$$' -bench BenchmarkBackendCommit -benchtime 1x -timeout 20m ./agent/dataplane/kernelvxlan/

kube-tools: ## build (once per machine, cached) kube-apiserver and kustomize for the Kubernetes tier
	hack/kube-tools.sh >/dev/null

clean:
	rm -rf $(BIN)

# The real-cluster tier (harness/cluster): kubelets, containerd, kube-proxy,
# the control plane, all built once per machine (hack/kube-tools.sh cluster),
# and Cutover installed from its release manifests with its own images.
cluster-tools: ## build (once per machine) the real-cluster tier's Kubernetes binaries, containerd and flanneld
	hack/kube-tools.sh cluster >/dev/null
	hack/flannel-tools.sh >/dev/null

CLUSTER_RESULTS ?= $(CURDIR)/results
cluster-e2e: cluster-tools agent-debs ## as root: real 3-node clusters, Cutover installed from its release and driven by kubectl cutover, beside the real flanneld: results/cluster_e2e_*.json, results/flannel_cluster.json
	mkdir -p results
	COT_CLUSTER_RESULTS=$(CLUSTER_RESULTS) flock /tmp/cutover-priv.lock $(GO) test -count=1 -p 1 -timeout 40m -v ./harness/cluster/...
