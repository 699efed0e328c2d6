"""The budget calculator as a page of its own, on Starlette served by uvicorn.

settings (a URL's query <-> a BudgetConfig, through engine.budget's knob table),
answers (what engine.budget says for a configuration, cached, drawn a few at a time),
app (the Starlette application: routes, Host allow-list, security headers), server
(the command line and uvicorn's limits), static/ (the page, its script and style).
`python -m widgets.budget_app` starts it.
"""
