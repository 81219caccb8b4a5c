"""genetic"""
