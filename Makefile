# dld — the two set-up commands are `make run` and `make test` (see README.md).
SWIFT ?= swift
PREFIX ?= $(HOME)/.local
UNIT_DIR ?= $(HOME)/.config/systemd/user

.PHONY: deps build release run test bench install uninstall clean

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
# XCTest runner (which would only report "0 tests") is turned off.
test: deps
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build --disable-xctest

# Figures, not assertions: prints times, ratios and memory (see docs/benchmarks.md).
# All parts by default; `make bench PARTS="small scale"` runs some of them.
PARTS ?=
bench: release
	scripts/bench.sh $(PARTS)

install: release
	install -d $(PREFIX)/bin $(UNIT_DIR) $(PREFIX)/share/doc/dld
	install -m 755 .build/release/dld .build/release/dlctl $(PREFIX)/bin/
	sed "s|@BINDIR@|$(PREFIX)/bin|" systemd/dld.service > $(UNIT_DIR)/dld.service
	install -m 644 README.md docs/*.md $(PREFIX)/share/doc/dld/
	@echo "installed; start with: systemctl --user daemon-reload && systemctl --user enable --now dld"

uninstall:
	rm -f $(PREFIX)/bin/dld $(PREFIX)/bin/dlctl $(UNIT_DIR)/dld.service
	rm -rf $(PREFIX)/share/doc/dld

clean:
	rm -rf .build
