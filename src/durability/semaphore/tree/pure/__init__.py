"""A budget tree's rules, as pure functions: which holder a client reaches, and what a child borrowed."""
