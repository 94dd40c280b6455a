// PII redaction: positives and look-alikes for every type, placeholders in
// place, the text around them intact, counts, the `types:` key, linear time.
#include "curate/filters/pii.h"

#include <gtest/gtest.h>

#include <string>

#include "curate/stages.h"
#include "test_util.h"

namespace nk::curate {
namespace {

using nk::test::contains;
using nk::test::error_of;

std::string red(const std::string& s, uint32_t mask = kAllPii) {
  return redact_pii(s, mask);
}

TEST(PiiEmail, InTextAndPunctuation) {
  EXPECT_EQ(red("Write to john.doe+news@example.co.uk, or (jane_x@mail.example.org)."),
            "Write to <EMAIL>, or (<EMAIL>).");
  EXPECT_EQ(red("<a href=\"mailto:Info@Example.COM\">mail</a>"),
            "<a href=\"mailto:<EMAIL>\">mail</a>");
  EXPECT_EQ(red("Email:bob@test.io;alice@test.io"), "Email:<EMAIL>;<EMAIL>");
  // Not addresses: no dot in the domain, a one-letter TLD, a handle, a dot at
  // the edge of the local part, empty labels.
  for (std::string s : {"user@localhost", "a@b.c", "follow @nekton today", "x.@y.com", "x@y..com",
                        "x@-y.com", "50 @ 3.5% interest", "a@b.123"})
    EXPECT_EQ(red(s), s) << s;
}

// An apostrophe may be part of the local part (RFC 5322's atext); a quote
// around the address stays outside it (issue 15).
TEST(PiiEmail, ApostrophesInTheLocalPart) {
  EXPECT_EQ(red("Write to o'brien@example.com or d'angelo.m@mail.example.it today."),
            "Write to <EMAIL> or <EMAIL> today.");
  EXPECT_EQ(red("don't email o'neil@example.com's old inbox"), "don't email <EMAIL>'s old inbox");
  EXPECT_EQ(red("'bob@example.org', `bob@example.org`, **bob@example.org**"),
            "'<EMAIL>', `<EMAIL>`, **<EMAIL>**");
  // The rest of atext joins an address to what precedes it in text.
  EXPECT_EQ(red("?to=bob@example.com&cc=1 \\email{bob@example.com} |bob@example.com|"),
            "?to=<EMAIL>&cc=1 \\email{<EMAIL>} |<EMAIL>|");
  EXPECT_EQ(red("Introduced in 2020-05-11T00:40:14Z!karl@freefriends.org."),
            "Introduced in 2020-05-11T00:40:14Z!<EMAIL>.");
  EXPECT_EQ(red("^Resent-Sender.*debian-user-request@lists.debian.org"), "^Resent-Sender.*<EMAIL>");
  for (std::string s : {"it's@home", "o'brien@localhost", "x'.@y.com"}) EXPECT_EQ(red(s), s) << s;
}

TEST(PiiPhone, NorthAmericanAndInternational) {
  EXPECT_EQ(red("Call (555) 234-5678 or 555.234.5678 today."), "Call <PHONE> or <PHONE> today.");
  EXPECT_EQ(red("Toll free: 1-800-555-0199, cell +1 555 234 5678."),
            "Toll free: <PHONE>, cell <PHONE>.");
  EXPECT_EQ(red("London +44 20 7946 0958; Berlin +49 (0)30 1234567; Paris +33 1 23 45 67 89."),
            "London <PHONE>; Berlin <PHONE>; Paris <PHONE>.");
  EXPECT_EQ(red("E.164: +4915112345678."), "E.164: <PHONE>.");
}

TEST(PiiPhone, DatesYearsAndPlainNumbersStay) {
  for (std::string s :
       {"On 2024-01-15 we met.", "In 1999 and 2000.", "Due 12/05/2023 or 15.01.2024.",
        "Order 5552345678 shipped.", "pi is 3.14159265", "Score: 123-456-789",
        "Population 1,234,567,890", "Version 2.3.4", "+5 points", "Room 555-1234",
        "Ranges 100-200-3000", "(555) 123-4567"})  // NXX may not start with 1
    EXPECT_EQ(red(s), s) << s;
}

// National formats without a '+', in each country's usual grouping (issue 15).
TEST(PiiPhone, NationalFormatsWithoutPlus) {
  const char* phones[] = {
      // UK
      "020 7946 0958", "07700 900123", "(020) 7946 0958", "0161 496 0123", "07700 900 123",
      // DE
      "030 12345678", "030/1234567", "0171 1234567", "(089) 1234567", "06221-123456",
      // FR
      "01 23 45 67 89", "06.12.34.56.78", "06-12-34-56-78",
      // JP
      "03-1234-5678", "090-1234-5678", "0120-12-3456",
      // BR
      "(11) 91234-5678", "(21) 2345-6789",
      // RU
      "8 (495) 123-45-67", "8 912 345 67 89", "(495) 123-45-67", "8-912-345-67-89"};
  for (std::string p : phones) {
    EXPECT_EQ(red("Call " + p + " today."), "Call <PHONE> today.") << p;
    EXPECT_EQ(red("Tel.: " + p + ";"), "Tel.: <PHONE>;") << p;
    EXPECT_EQ(red("(" + p + ")"), "(<PHONE>)") << p;
  }
  EXPECT_EQ(red("Tel. 030/1234567, Fax 030/1234568\nMobil: 0171 1234567"),
            "Tel. <PHONE>, Fax <PHONE>\nMobil: <PHONE>");
}

// Numbers that look like national phone numbers and are not.
TEST(PiiPhone, DatesPricesIsbnsAndVersionsStay) {
  for (std::string s :
       {// dates
        "On 2024-01-15 we met.", "Due 15.01.2024.", "From 01.02.2024 to 03.04.2025.",
        "Dated 01/02/2024, 01-02-2024 or 2024/01/15.", "Between 1999-2004 and 08.15.",
        // prices
        "It costs $0.99, 0,99 €, 1 234,56 € or €1.234,56; 19.99 USD.",
        // ISBNs
        "ISBN 978-3-16-148410-0 and 0-306-40615-2.", "ISBN 0 306 40615 2 or 978 0 306 40615 7.",
        // versions
        "Versions 1.2.3, 0.10.2, 10.0.19041, 8.1.2 and 0.9.8.",
        // ordinary numbers
        "About 8 000 000 people, or 8 912 345 678 in all.", "Codes 0815, 007 and 0 1 2.",
        "Scores 01 23 45, 0.5 and 08 15 30.", "Postcode 75008 Paris, 01067 Dresden.",
        "Lines 030 1234 and 0301234567.", "Pages (12) 345-678.", "(2019) 1234-5678"})
    EXPECT_EQ(red(s), s) << s;
}

TEST(PiiSsn, ValidAndNeverIssuedNumbers) {
  EXPECT_EQ(red("SSN 123-45-6789."), "SSN <SSN>.");
  EXPECT_EQ(red("SSN: 078 05 1120"), "SSN: <SSN>");
  for (std::string s : {"000-12-3456", "666-12-3456", "912-34-5678", "123-00-4567", "123-45-0000",
                        "123-45-67890", "1123-45-6789", "123-45-6789-1"})
    EXPECT_EQ(red(s), s) << s;
}

TEST(PiiCreditCard, LuhnRequired) {
  EXPECT_EQ(red("Visa 4111 1111 1111 1111 exp 12/29"), "Visa <CREDIT_CARD> exp 12/29");
  EXPECT_EQ(red("card=4111-1111-1111-1111;"), "card=<CREDIT_CARD>;");
  EXPECT_EQ(red("4111111111111111"), "<CREDIT_CARD>");
  EXPECT_EQ(red("Amex 3782 822463 10005."), "Amex <CREDIT_CARD>.");
  EXPECT_EQ(red("MC 5555555555554444"), "MC <CREDIT_CARD>");
  for (std::string s : {"4111 1111 1111 1112", "4111111111111112", "41111111111111111111111",
                        "4111-1111 1111-1111", "1234567890123"})
    EXPECT_EQ(red(s), s) << s;
}

TEST(PiiIp, Ipv4OctetsAndIpv6Forms) {
  EXPECT_EQ(red("from 192.168.0.1 and 10.0.0.255."), "from <IP_ADDRESS> and <IP_ADDRESS>.");
  EXPECT_EQ(red("host 8.8.8.8:53"), "host <IP_ADDRESS>:53");
  for (std::string s : {"256.1.1.1", "1.2.3.4.5", "192.168.01.1", "1.2.3", "10.0.0.300"})
    EXPECT_EQ(red(s), s) << s;
  EXPECT_EQ(red("v6 2001:db8::8a2e:370:7334 ok"), "v6 <IP_ADDRESS> ok");
  EXPECT_EQ(red("2001:0db8:0000:0000:0000:ff00:0042:8329"), "<IP_ADDRESS>");
  EXPECT_EQ(red("[::1]:8080 and ::ffff:192.0.2.128."), "[<IP_ADDRESS>]:8080 and <IP_ADDRESS>.");
  EXPECT_EQ(red("fe80::1"), "<IP_ADDRESS>");
  for (std::string s : {"at 12:30:45", "std::vector<int>", "A::B", "1:2:3:4:5:6:7", "dead::beef",
                        "1::2::3", "12345::1", "harmonical, for 24:16::12:9.", "as 1:2::3:4"})
    EXPECT_EQ(red(s), s) << s;
}

// A numbered heading "6.2.4.1." looks like an address; context decides.
TEST(PiiIp, SectionNumbersAreNotAddresses) {
  for (std::string s :
       {"6.2.4.1. Configuring the network", "6.2.4.1 Configuring the network",
        "Intro.\n6.2.4.1. Configuring\n  1.2.3.4) Step four", "## 6.2.4.1 Überblick",
        "> 6.2.4.1 概要", "As section 6.2.4.1 says, and sec. 1.1.1.1 too.",
        "See § 6.2.4.1 and chapter 10.2.3.4.", "Upgrade to version 1.2.3.4 now."})
    EXPECT_EQ(red(s), s) << s;
  // Addresses, also at a sentence's end or a line's start.
  EXPECT_EQ(red("see 10.0.0.1.\nNext"), "see <IP_ADDRESS>.\nNext");
  EXPECT_EQ(red("The gateway is 10.1.2.3. Then restart."),
            "The gateway is <IP_ADDRESS>. Then restart.");
  EXPECT_EQ(red("10.0.0.1 Gateway\n10.1.2.3 gateway\n192.168.1.1 Router\n1.2.3.4\n"),
            "<IP_ADDRESS> Gateway\n<IP_ADDRESS> gateway\n<IP_ADDRESS> Router\n<IP_ADDRESS>\n");
  EXPECT_EQ(red("6.2.4.1"), "<IP_ADDRESS>");  // alone: nothing says heading
}

TEST(PiiUrl, OnlyUrlsWithCredentials) {
  EXPECT_EQ(red("db at postgres://admin:s3cr%40t@db.example.com:5432/app, see docs."),
            "db at <URL_WITH_CREDENTIALS>, see docs.");
  EXPECT_EQ(red("(https://u:p@10.0.0.1/x)"), "(<URL_WITH_CREDENTIALS>)");
  for (std::string s :
       {"https://example.com/a?b=c", "http://host:8080/path", "git+ssh://git.example.com/repo"})
    EXPECT_EQ(red(s), s) << s;
}

TEST(PiiStage, CountsTypesAndKeepsEveryDocument) {
  StageConfig c(YAML::Load("type: pii"), "p.yaml", 1);
  auto s = stage_registry().find("pii")->make_doc(c);
  c.finish();
  Document d;
  d.text =
      "Mail a@b.com or c@d.org, call 555-234-5678, SSN 123-45-6789, card "
      "4111111111111111, ip 1.2.3.4, url ftp://u:p@h.example/x. End.";
  Counters n;
  Verdict v = s->apply(d, n);
  EXPECT_TRUE(v.keep);
  EXPECT_EQ(d.text,
            "Mail <EMAIL> or <EMAIL>, call <PHONE>, SSN <SSN>, card <CREDIT_CARD>, ip "
            "<IP_ADDRESS>, url <URL_WITH_CREDENTIALS>. End.");
  EXPECT_EQ(n["redacted_email"], 2);
  EXPECT_EQ(n["redacted_phone"], 1);
  EXPECT_EQ(n["redacted_ssn"], 1);
  EXPECT_EQ(n["redacted_credit_card"], 1);
  EXPECT_EQ(n["redacted_ip_address"], 1);
  EXPECT_EQ(n["redacted_url_with_credentials"], 1);

  StageConfig only(YAML::Load("{type: pii, types: [email, ssn]}"), "p.yaml", 1);
  auto e = stage_registry().find("pii")->make_doc(only);
  d.text = "a@b.com 555-234-5678 123-45-6789";
  Counters m;
  e->apply(d, m);
  EXPECT_EQ(d.text, "<EMAIL> 555-234-5678 <SSN>");
  EXPECT_EQ(m.count("redacted_phone"), 0u);

  std::string err = error_of([] {
    StageConfig bad(YAML::Load("type: pii\ntypes: [email, passport]\n"), "p.yaml", 4);
    stage_registry().find("pii")->make_doc(bad);
  });
  EXPECT_TRUE(contains(err, "p.yaml:2: stage 4 (pii): key 'types'") && contains(err, "'passport'"))
      << err;
}

TEST(PiiSpeed, AdversarialMegabytesInLinearTime) {
  for (std::string unit : {"1.1.1.1.", "a@", "@a.", ":::1", "1-", "+1 ", "x://", "a:b@", "0 1-",
                           "(1) ", "8 (", "'a'@", "\n1.1.1.1 A", "section 1.1.1.1 "}) {
    std::string big;
    while (big.size() < (2u << 20)) big += unit;
    // Linear time: a quadratic scanner would hang until the test's timeout
    // (no wall-clock assertion in tests).
    std::string out = red(big);
    EXPECT_FALSE(out.empty()) << unit;
  }
}

}  // namespace
}  // namespace nk::curate
