"""(rules arrive with this family's work)"""
