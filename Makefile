# The course's two commands: `make lab` opens it, `make test` checks everything.
# Both set up .venv on first use and take seconds when nothing changed.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# Extra JupyterLab arguments, e.g. make lab LAB_ARGS="--port 8890 --no-browser"
LAB_ARGS ?=
# Extra pytest arguments, e.g. make test PYTEST_ARGS="-k budget"
PYTEST_ARGS ?=
# JupyterLab refuses to run as root unless told it may.
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: lab test course venv clean-venv budget-app

venv: $(STAMP)

# Optional extras installed where their wheels install (mpi: a real MPI for lesson 12 and
# the data-parallel tests). Where one does not install, the lessons and tests that need it
# say so and run without it. `make test OPTIONAL_EXTRAS=` is the bare configuration.
OPTIONAL_EXTRAS ?= mpi

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@for extra in $(OPTIONAL_EXTRAS); do \
	    $(BIN)/python -m pip install -q -e ".[$$extra]" \
	    || echo "The optional extra '$$extra' does not install here; what needs it will say so."; \
	done
	@touch $(STAMP)

# The course's lab asks no "get notified about Jupyter news?" question and fetches nothing
# from the web on its own (JupyterLab's settings overrides inside this venv only).
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
$(LAB_OVERRIDES): $(STAMP)
	@mkdir -p $(dir $@)
	@printf '%s\n' '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > $@

# The lab opens on the start page. Its terminals start in course/ with .venv/bin first on
# PATH (set again after ~/.bashrc, which may put pyenv or conda first), so `pytest` and
# `python` typed there are the course's own.
LAB_BASHRC := $(VENV)/lab-terminal.bashrc
lab: $(STAMP) $(LAB_OVERRIDES)
	@printf '%s\n' '[ -f ~/.bashrc ] && . ~/.bashrc' \
	    'export PATH="$(abspath $(BIN)):$$PATH" VIRTUAL_ENV="$(abspath $(VENV))"' > $(LAB_BASHRC)
	@echo "Starting JupyterLab on course/ (the URL with its token follows; Ctrl-C stops it)"
	cd course && PATH="$(abspath $(BIN)):$$PATH" VIRTUAL_ENV="$(abspath $(VENV))" \
	    $(abspath $(BIN))/jupyter lab $(ROOT_FLAG) \
	    --LabApp.default_url=/lab/tree/00_start_here.ipynb \
	    --ServerApp.terminado_settings="{'shell_command': ['bash', '--rcfile', '$(abspath $(LAB_BASHRC))']}" \
	    $(LAB_ARGS)

# Every test: engine, widgets, the browser test, and nbval over every solution
# notebook (two workers; a notebook's cells stay together on one worker).
test: $(STAMP) $(LAB_OVERRIDES)
	$(BIN)/python -m pytest -n 2 --dist loadfile tests course/solutions --nbval $(PYTEST_ARGS)

# Rebuild student and solution notebooks from course/source (LESSONS="00 01" for some).
# It refuses to replace a student notebook you edited; FORCE=1 moves yours to
# course/backups/ first.
FORCE ?=
course: $(STAMP)
	$(BIN)/python tools/build_course.py $(if $(FORCE),--force) $(LESSONS)

# The budget calculator as a page of its own on http://127.0.0.1:8866 (this machine only;
# --listen serves elsewhere); e.g. make budget-app APP_ARGS="--preset llama2-7b --no-browser".
# Its web stack (Starlette, uvicorn: the optional extra `page`) is installed on first use.
APP_ARGS ?=
budget-app: $(STAMP)
	@$(BIN)/python -c "import starlette, uvicorn" 2>/dev/null \
	    || $(BIN)/python -m pip install -q -e '.[page]'
	$(BIN)/python -m widgets.budget_app $(APP_ARGS)

clean-venv:
	rm -rf $(VENV)
