"""Writes the shipped GDPval-style task set (tasks/gdpval): rows in GDPval's columns plus each task's
rubric, the reference files, and a finished deliverable per task (reference_solution) for
`dockyard env check`. The xlsx and docx solutions are written with openpyxl and python-docx.
Run from the repository root: python tools/make_gdpval_tasks.py
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

OUT = Path("tasks/gdpval")

SALES = "region,month,amount\nNorth,2026-01,1200\nSouth,2026-01,800\nWest,2026-01,650.5\nNorth,2026-02,1300\n" \
        "South,2026-02,950\nWest,2026-02,700\nNorth,2026-03,1100\nSouth,2026-03,1000.25\nWest,2026-03,720\n"
NOTES = ("Weekly planning call, 3 March. Present: Dana (ops), Luis (finance), Priya (engineering).\n"
         "- Agreed to move the warehouse cut-over to 14 April; Dana owns the plan.\n"
         "- Luis will send the revised Q2 budget by Friday.\n"
         "- Priya raised that the label printer integration is two weeks late; the team decided to ship "
         "without it and add it in May.\n- Next call on 10 March.\n")
ORDER = {"customer": "Harbor Cafe", "items": [{"item": "Coffee beans 1kg", "quantity": 4, "unit_price": 18.5},
                                              {"item": "Oat milk 1l", "quantity": 12, "unit_price": 2.1},
                                              {"item": "Paper cups (100)", "quantity": 3, "unit_price": 6.0}]}
EXPENSES = "category,amount\nRent,2400\nSalaries,9100\nSoftware,640\nTravel,410\n"

TASKS = [
    {"task_id": "sales-summary", "sector": "Retail Trade", "occupation": "Sales Managers",
     "prompt": "Our quarterly sales export (sales.csv) lists every region's monthly sales. Prepare a summary "
               "CSV with one row per region, columns region and total (the sum of its amounts, two decimals), "
               "regions in alphabetical order.",
     "reference_files": ["reference/sales-summary/sales.csv"], "files": {"sales.csv": SALES},
     "rubric": {"deliverable": "summary.csv", "checks": [
         {"check": "columns", "columns": ["region", "total"]}, {"check": "row_count", "equals": 3},
         {"check": "cell", "where": {"region": "North"}, "column": "total", "equals": 3600, "points": 2},
         {"check": "cell", "where": {"region": "South"}, "column": "total", "equals": 2750.25, "points": 2},
         {"check": "cell", "where": {"region": "West"}, "column": "total", "equals": 2070.5, "points": 2},
         {"check": "regex", "pattern": r"North[^\n]*\n[^\n]*South[^\n]*\n[^\n]*West"}]},
     "solution": ("summary.csv", "region,total\nNorth,3600.00\nSouth,2750.25\nWest,2070.50\n")},
    {"task_id": "meeting-memo", "sector": "Management of Companies", "occupation": "Project Management Specialists",
     "prompt": "Turn the notes of this week's planning call (notes.txt) into a short memo for the wider team in "
               "markdown, with the sections Summary, Decisions and Action items. Name an owner for every action "
               "item. Keep it under 250 words.",
     "reference_files": ["reference/meeting-memo/notes.txt"], "files": {"notes.txt": NOTES},
     "rubric": {"deliverable": "memo.md", "checks": [
         {"check": "headings", "headings": ["Summary", "Decisions", "Action items"], "points": 2},
         {"check": "contains", "text": "14 April"}, {"check": "contains", "text": "Dana"},
         {"check": "contains", "text": "Luis"}, {"check": "contains", "text": "label printer"},
         {"check": "max_words", "limit": 250}, {"check": "min_words", "limit": 40}]},
     "solution": ("memo.md", "# Planning call, 3 March\n\n## Summary\nThe warehouse cut-over moves, the Q2 budget is "
                             "being revised, and the label printer integration ships later.\n\n## Decisions\n"
                             "- The warehouse cut-over moves to 14 April.\n- We ship without the label printer "
                             "integration and add it in May.\n\n## Action items\n- Dana: plan the cut-over for "
                             "14 April.\n- Luis: send the revised Q2 budget by Friday.\n- Priya: schedule the label "
                             "printer integration for May.\n")},
    {"task_id": "invoice-lines", "sector": "Finance and Insurance", "occupation": "Billing Clerks",
     "prompt": "Prepare the invoice lines for the order in order.json as a CSV with the columns item, quantity, "
               "unit_price and line_total (quantity times unit price), one row per item, then a last row whose "
               "item is TOTAL and whose line_total is the sum.",
     "reference_files": ["reference/invoice-lines/order.json"], "files": {"order.json": json.dumps(ORDER, indent=2)},
     "rubric": {"deliverable": "invoice.csv", "checks": [
         {"check": "columns", "columns": ["item", "quantity", "unit_price", "line_total"]},
         {"check": "row_count", "equals": 4},
         {"check": "cell", "where": {"item": "Coffee beans 1kg"}, "column": "line_total", "equals": 74},
         {"check": "cell", "where": {"item": "Oat milk 1l"}, "column": "line_total", "equals": 25.2},
         {"check": "cell", "where": {"item": "TOTAL"}, "column": "line_total", "equals": 117.2, "points": 2}]},
     "solution": ("invoice.csv", "item,quantity,unit_price,line_total\nCoffee beans 1kg,4,18.50,74.00\n"
                                 "Oat milk 1l,12,2.10,25.20\nPaper cups (100),3,6.00,18.00\nTOTAL,,,117.20\n")},
    {"task_id": "job-posting", "sector": "Professional, Scientific, and Technical Services",
     "occupation": "Human Resources Specialists",
     "prompt": "Write a job posting in markdown for a remote junior data engineer who will maintain Python data "
               "pipelines. Include the sections Responsibilities, Requirements and How to apply, and state the "
               "salary range 55,000-65,000 EUR. At most 300 words.",
     "reference_files": [],
     "rubric": {"deliverable": "posting.md", "checks": [
         {"check": "headings", "headings": ["Responsibilities", "Requirements", "How to apply"], "points": 2},
         {"check": "contains", "text": "Python"}, {"check": "contains", "text": "remote"},
         {"check": "regex", "pattern": r"55[,.]?000"}, {"check": "max_words", "limit": 300},
         {"check": "not_contains", "text": "lorem ipsum"}]},
     "solution": ("posting.md", "# Junior Data Engineer (remote)\n\nSalary: 55,000-65,000 EUR a year.\n\n"
                                "## Responsibilities\n- Maintain and test our Python data pipelines.\n- Watch the "
                                "nightly loads and fix what breaks.\n\n## Requirements\n- Working Python and SQL.\n"
                                "- Care for tests and documentation.\n\n## How to apply\nSend a CV and a short note "
                                "to jobs@example.com.\n")},
    {"task_id": "budget-workbook", "sector": "Finance and Insurance", "occupation": "Financial Analysts",
     "prompt": "Build the monthly budget workbook from expenses.csv: an xlsx file with a sheet named Budget whose "
               "columns are Category and Amount (one row per category, as in the file) and a last row "
               "Total with the sum.",
     "reference_files": ["reference/budget-workbook/expenses.csv"], "files": {"expenses.csv": EXPENSES},
     "rubric": {"deliverable": "budget.xlsx", "checks": [
         {"check": "sheets", "names": ["Budget"]},
         {"check": "columns", "sheet": "Budget", "columns": ["Category", "Amount"]},
         {"check": "cell", "sheet": "Budget", "where": {"Category": "Salaries"}, "column": "Amount", "equals": 9100},
         {"check": "cell", "sheet": "Budget", "where": {"Category": "Total"}, "column": "Amount", "equals": 12550,
          "points": 2}]},
     "solution": ("budget.xlsx", None)},
    {"task_id": "cover-letter", "sector": "Educational Services", "occupation": "Career Counselors",
     "prompt": "Write a one-page cover letter as a Word document (docx) for Sam Lee applying to the Librarian post "
               "at Riverside Library. Start with the heading Cover letter, mention Sam's six years of archive work, "
               "and close with Sincerely.",
     "reference_files": [],
     "rubric": {"deliverable": "cover_letter.docx", "checks": [
         {"check": "headings", "headings": ["Cover letter"]}, {"check": "contains", "text": "Riverside Library"},
         {"check": "contains", "text": "six years"}, {"check": "contains", "text": "Sincerely"},
         {"check": "max_words", "limit": 400}]},
     "solution": ("cover_letter.docx", None)},
]


def write_binary_solutions(folder: Path) -> None:
    import docx
    import openpyxl

    book = openpyxl.Workbook()
    book.properties.created = book.properties.modified = datetime(2026, 1, 5, 12, 0)
    sheet = book.active
    sheet.title = "Budget"
    sheet.append(["Category", "Amount"])
    for line in EXPENSES.strip().splitlines()[1:]:
        category, amount = line.split(",")
        sheet.append([category, float(amount)])
    sheet.append(["Total", 12550.0])
    book.save(folder / "budget-workbook" / "budget.xlsx")
    document = docx.Document()
    document.add_heading("Cover letter", level=1)
    document.add_paragraph("Dear hiring committee at Riverside Library,")
    document.add_paragraph("I am applying for the Librarian post. In six years of archive work I catalogued, "
                           "preserved and digitised collections, and helped readers find what they needed.")
    document.add_paragraph("Sincerely,\nSam Lee")
    document.core_properties.created = document.core_properties.modified = datetime(2026, 1, 5, 12, 0)
    document.save(folder / "cover-letter" / "cover_letter.docx")


def main() -> None:
    for sub in ("reference", "solutions"):
        shutil.rmtree(OUT / sub, ignore_errors=True)
    rows = []
    for task in TASKS:
        for name, text in task.get("files", {}).items():
            path = OUT / "reference" / task["task_id"] / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        name, text = task["solution"]
        solution = OUT / "solutions" / task["task_id"] / name
        solution.parent.mkdir(parents=True, exist_ok=True)
        if text is not None:
            solution.write_text(text)
        rows.append({key: task[key] for key in ("task_id", "sector", "occupation", "prompt", "reference_files")}
                    | {"rubric": json.dumps(task["rubric"]),
                       "reference_solution": str(solution.relative_to(OUT))})
    write_binary_solutions(OUT / "solutions")
    (OUT / "tasks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} tasks to {OUT}")


if __name__ == "__main__":
    main()
