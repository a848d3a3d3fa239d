# dld — the two set-up commands are `make run` and `make test` (see README.md).
SWIFT ?= swift
PREFIX ?= $(HOME)/.local

.PHONY: deps build release run test lint format crash crash-mutants fuzz sanitize bench fleet-chaos install install-files uninstall clean

deps:
	@scripts/deps.sh

build: deps
	$(SWIFT) build

release: deps
	$(SWIFT) build -c release

# Starts the daemon in the foreground with the default paths (see docs/configuration.md).
run: release
	.build/release/dld

# All tests: unit tests and end-to-end tests of the real binaries. The build step builds the
# executables too, which the end-to-end tests start. Every test uses Swift Testing, so the
# XCTest runner (which would only report "0 tests") is turned off. scripts/test.sh repeats the
# failing tests' lines at the end of the output.
test: deps
	$(SWIFT) build --build-tests
	$(SWIFT) build --product generate-manual
	@# The fleet under faults, one short seed (`make fleet-chaos` runs many, longer); before the
	@# suite, so that the test runner's summary stays the last lines.
	FLEET_CHAOS_SHORT=1 FLEET_CHAOS_SEED=$(FLEET_CHAOS_TEST_SEED) python3 scripts/fleet_chaos.py --dld .build/debug/dld --out .build/fleet-chaos
	SWIFT=$(SWIFT) scripts/test.sh

# The power-cut suite in full: dld under powercutfs (scripts/powercutfs.c, a FUSE filesystem
# that drops what a power cut would lose), cut at every chosen point and restarted (`make test`
# runs a short set of the same points). See docs/architecture.md, "Proven under power loss".
crash: deps
	$(SWIFT) build --build-tests
	DLD_POWERCUT=full SWIFT=$(SWIFT) scripts/test.sh --filter 'PowerCutTests|DiskFaultTests'

# Deliberate breaks of dld (Tests/PowerCutMutants/mutants.txt): each patch is applied to a scratch
# copy of the tree, dld built there (.build-mutants, incremental after the first full build), and
# the power-cut points listed for it run against it; fails if a mutant survives (a point that
# passes). `make crash-mutants MUTANTS="offset-before-sync-single"` runs some of them.
MUTANTS ?=
crash-mutants: deps
	$(SWIFT) build --build-tests
	SWIFT=$(SWIFT) scripts/crash-mutants.sh $(MUTANTS)

# libFuzzer on the parsers of untrusted input (JSON-RPC, the config file, Content-Disposition,
# input lists, netrc, a response head, HLS playlists): builds the targets of Fuzz/ (a package of its own, so
# `make test` never builds them; under a minute, only DLCore and DLRPC) and runs each for
# FUZZ_SECONDS from its seed corpus in Fuzz/corpus/<target>/. Fails if one crashes; the input
# is in Fuzz/.build/artifacts/<target>/ and belongs in a regression test in Tests/.
# `make fuzz FUZZ_TARGETS="json netrc"` runs some of them.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz:
	SWIFT=$(SWIFT) FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh $(FUZZ_TARGETS)

# The sources as the toolchain's formatter would write them (.swift-format: 4 spaces, 140
# columns). `make format` rewrites them so; CI runs `make lint` before the tests.
lint:
	$(SWIFT) format lint --strict --recursive --configuration .swift-format Sources Tests Package.swift

format:
	$(SWIFT) format format --in-place --recursive --configuration .swift-format Sources Tests Package.swift

# The unit and store tests (not the end-to-end ones) under AddressSanitizer, then
# ThreadSanitizer: two full debug builds of their own (.build-asan, .build-tsan), about ten
# minutes each the first time. The store tests start their own PostgreSQL (deps installs it).
# `make sanitize SANITIZERS=thread` runs one of them.
SANITIZERS ?=
sanitize: deps
	SWIFT=$(SWIFT) scripts/sanitize.sh $(SANITIZERS)

# The fleet's partition harness (scripts/fleet_chaos.py, issue #36; needs root): three dld
# workers on one PostgreSQL, each in a network namespace of its own, under random commands and
# faults (partitions, SIGSTOP, clock steps, PostgreSQL restarts, a second daemon with one
# worker's id, a file changing at the origin); then every fault healed and the history checked.
# FLEET_CHAOS_SEEDS seeds of FLEET_CHAOS_SECONDS each; FLEET_CHAOS_SHORT=1 runs one seed in
# about a minute; FLEET_CHAOS_SEED=N replays seed N; FLEET_CHAOS_FAULTS=sigstop,pg_restart draws
# only those. Run folders go to .build/fleet-chaos/;
# fails on any violation. See docs/architecture.md, "The fleet under faults".
FLEET_CHAOS_SEEDS ?= 5
# The seed of the short run in `make test` (replayable; it found the duplicate worker id on the
# code before the epochs).
FLEET_CHAOS_TEST_SEED ?= 5
FLEET_CHAOS_SECONDS ?= 120
FLEET_CHAOS_SHORT ?=
FLEET_CHAOS_SEED ?=
FLEET_CHAOS_FAULTS ?=
fleet-chaos: CONFIGURATION = debug
fleet-chaos: deps
	$(SWIFT) build -c $(CONFIGURATION) --product dld
	FLEET_CHAOS_SEEDS=$(FLEET_CHAOS_SEEDS) FLEET_CHAOS_SECONDS=$(FLEET_CHAOS_SECONDS) FLEET_CHAOS_SHORT=$(FLEET_CHAOS_SHORT) \
		FLEET_CHAOS_SEED=$(FLEET_CHAOS_SEED) FLEET_CHAOS_FAULTS=$(FLEET_CHAOS_FAULTS) python3 scripts/fleet_chaos.py --dld $(BIN)/dld --out .build/fleet-chaos

# Figures, not assertions: prints times, ratios and memory (see docs/benchmarks.md).
# All parts by default; `make bench PARTS="small scale"` runs some of them.
PARTS ?=
bench: release
	@scripts/bench-deps.sh
	scripts/bench.sh $(PARTS)

# Installs for one user by default (PREFIX=~/.local); packagers set PREFIX=/usr and DESTDIR.
# Every file goes to its XDG/FHS place under $(DESTDIR)$(PREFIX): binaries in bin, the user
# units where systemd --user looks (share/systemd/user), completions where bash-completion,
# zsh and fish look, manual pages dld(1), dlctl(1) (generated from the command definitions
# by swift-argument-parser's generate-manual) and dld.conf(5) (from docs/configuration.md).
# `make install` builds release binaries first; `make install-files CONFIGURATION=debug`
# installs what a build already made (the tests do that).
CONFIGURATION ?= release
BIN ?= .build/$(CONFIGURATION)
BINDIR = $(PREFIX)/bin
DATADIR = $(PREFIX)/share
UNIT_DIR ?= $(DATADIR)/systemd/user
MANDIR ?= $(DATADIR)/man
BASH_COMPLETION_DIR ?= $(DATADIR)/bash-completion/completions
ZSH_COMPLETION_DIR ?= $(DATADIR)/zsh/site-functions
FISH_COMPLETION_DIR ?= $(DATADIR)/fish/vendor_completions.d
DOC_DIR ?= $(DATADIR)/doc/dld

install: deps
	$(SWIFT) build -c $(CONFIGURATION) --product dld
	$(SWIFT) build -c $(CONFIGURATION) --product dlctl
	$(SWIFT) build -c $(CONFIGURATION) --product generate-manual
	$(MAKE) install-files
	@echo "installed in $(DESTDIR)$(PREFIX); start with: systemctl --user daemon-reload && systemctl --user enable --now dld (or dld.socket)"

install-files:
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNIT_DIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 \
		$(DESTDIR)$(BASH_COMPLETION_DIR) $(DESTDIR)$(ZSH_COMPLETION_DIR) $(DESTDIR)$(FISH_COMPLETION_DIR) $(DESTDIR)$(DOC_DIR)
	install -m 755 $(BIN)/dld $(BIN)/dlctl $(DESTDIR)$(BINDIR)/
	sed "s|@BINDIR@|$(BINDIR)|" systemd/dld.service > $(DESTDIR)$(UNIT_DIR)/dld.service
	install -m 644 systemd/dld.socket systemd/dld-http.socket $(DESTDIR)$(UNIT_DIR)/
	chmod 644 $(DESTDIR)$(UNIT_DIR)/dld.service
	set -e; for tool in dld dlctl; do \
		$(BIN)/$$tool --generate-completion-script bash > $(DESTDIR)$(BASH_COMPLETION_DIR)/$$tool; \
		$(BIN)/$$tool --generate-completion-script zsh > $(DESTDIR)$(ZSH_COMPLETION_DIR)/_$$tool; \
		$(BIN)/$$tool --generate-completion-script fish > $(DESTDIR)$(FISH_COMPLETION_DIR)/$$tool.fish; \
		$(BIN)/generate-manual $(BIN)/$$tool --section 1 --authors "the dld authors" -o $(DESTDIR)$(MANDIR)/man1; \
	done
	python3 scripts/md2man.py docs/configuration.md dld.conf 5 "dld configuration" > $(DESTDIR)$(MANDIR)/man5/dld.conf.5
	chmod 644 $(DESTDIR)$(MANDIR)/man1/dld.1 $(DESTDIR)$(MANDIR)/man1/dlctl.1 $(DESTDIR)$(MANDIR)/man5/dld.conf.5 \
		$(DESTDIR)$(BASH_COMPLETION_DIR)/dld $(DESTDIR)$(BASH_COMPLETION_DIR)/dlctl $(DESTDIR)$(ZSH_COMPLETION_DIR)/_dld \
		$(DESTDIR)$(ZSH_COMPLETION_DIR)/_dlctl $(DESTDIR)$(FISH_COMPLETION_DIR)/dld.fish $(DESTDIR)$(FISH_COMPLETION_DIR)/dlctl.fish
	install -m 644 README.md docs/*.md $(DESTDIR)$(DOC_DIR)/

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/dld $(DESTDIR)$(BINDIR)/dlctl
	rm -f $(DESTDIR)$(UNIT_DIR)/dld.service $(DESTDIR)$(UNIT_DIR)/dld.socket $(DESTDIR)$(UNIT_DIR)/dld-http.socket
	rm -f $(DESTDIR)$(MANDIR)/man1/dld.1 $(DESTDIR)$(MANDIR)/man1/dlctl.1 $(DESTDIR)$(MANDIR)/man5/dld.conf.5
	rm -f $(DESTDIR)$(BASH_COMPLETION_DIR)/dld $(DESTDIR)$(BASH_COMPLETION_DIR)/dlctl
	rm -f $(DESTDIR)$(ZSH_COMPLETION_DIR)/_dld $(DESTDIR)$(ZSH_COMPLETION_DIR)/_dlctl
	rm -f $(DESTDIR)$(FISH_COMPLETION_DIR)/dld.fish $(DESTDIR)$(FISH_COMPLETION_DIR)/dlctl.fish
	rm -rf $(DESTDIR)$(DOC_DIR)

clean:
	rm -rf .build .build-asan .build-tsan .build-mutants Fuzz/.build
